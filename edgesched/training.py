"""Local training and evaluation on the CPU, with the timing figures the scheduler learns from."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class TrainReport:
    """What a local job did and how fast: the performance model's raw observations."""

    samples: int
    steps: int
    seconds: float
    samples_per_second: float
    loss: float

    def as_metrics(self) -> dict[str, float | int]:
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


def train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    max_steps: int | None = None,
    proximal_mu: float = 0.0,
) -> TrainReport:
    """SGD with momentum over shuffled mini-batches; `max_steps` caps the work (None: no cap).

    `proximal_mu` > 0 adds FedProx's term mu/2 ||w - w_global||^2, which keeps a client's
    weights near the model it was sent."""
    gen = torch.Generator().manual_seed(int(seed))
    start_weights = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else []
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    steps = samples = 0
    loss_sum = 0.0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in torch.randperm(len(targets), generator=gen).split(batch_size):
            if max_steps is not None and steps >= max_steps:
                break
            opt.zero_grad()
            loss = loss_fn(model(inputs[batch]), targets[batch])
            objective = loss
            if start_weights:
                drift = sum(((p - p0) ** 2).sum() for p, p0 in zip(model.parameters(), start_weights, strict=True))
                objective = loss + proximal_mu / 2 * drift
            objective.backward()
            opt.step()
            steps += 1
            samples += len(batch)
            loss_sum += loss.item() * len(batch)
    seconds = time.perf_counter() - start
    return TrainReport(
        samples=samples,
        steps=steps,
        seconds=seconds,
        samples_per_second=samples / seconds if seconds > 0 else 0.0,
        loss=loss_sum / samples if samples else float("nan"),
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of `model` on (x, y)."""
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss = correct = 0.0
    for start in range(0, len(y), batch_size):
        xb = torch.from_numpy(x[start : start + batch_size])
        yb = torch.from_numpy(y[start : start + batch_size])
        logits = model(xb)
        loss += loss_fn(logits, yb).item()
        correct += (logits.argmax(1) == yb).sum().item()
    return loss / len(y), correct / len(y)


def scorer(model: nn.Module, x: np.ndarray, y: np.ndarray) -> Callable[[Sequence[np.ndarray]], tuple[float, float]]:
    """weights -> (loss, accuracy) of `model` carrying them on (x, y): how a server scores a global model."""
    keys = list(model.state_dict())

    def score(weights: Sequence[np.ndarray]) -> tuple[float, float]:
        model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights, strict=True)})
        return evaluate(model, x, y)

    return score
