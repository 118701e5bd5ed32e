"""The shipped tasks' models (edgesched.tasks), sized for edge boards: a few hundred thousand
parameters at most, CPU-friendly."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two 5x5 conv blocks and one hidden layer for 28x28 grey images (~0.2 M params)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SensorCNN(nn.Module):
    """A 1-D CNN over [6 channels, 128 steps] accelerometer + gyroscope windows."""

    def __init__(self, num_classes: int = 12, channels: int = 6) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(64, 64, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsMLP(nn.Module):
    """One hidden layer over the 64 pixels of an 8x8 digit."""

    def __init__(self, num_classes: int = 10, inputs: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
