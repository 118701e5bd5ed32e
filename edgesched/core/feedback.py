"""Convergence feedback: watch the global loss and the size of each server step, and steer.

When the loss rises above its recent best by more than `tolerance`, or a server step is far
larger than the recent ones (a stale or diverging update pulling hard), training is unstable:
the monitor lowers, one notch each, the most local epochs, the staleness it accepts and the
server's step size. Local epochs go no lower than `min_epochs`, FedAvg's own: the epochs above
it are what makes local models drift apart, and cutting below it starved training (on hapt,
whose evaluation loss jumps 5-15 % between rounds even under FedAvg, jobs fell to 1 epoch and
accuracy stalled at 85 %). After `patience` calm rounds it gives one notch back, up to the configured
values; if the round right after giving back wobbles, the patience doubles, so a fleet that
cannot take the configured values stops being tried at them every few rounds. Every change is
returned with its reason so the decision log can show why.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Knobs:
    max_epochs: int
    max_staleness: int
    server_lr: float


@dataclass(frozen=True)
class FeedbackConfig:
    window: int = 5  # rounds of history the trend is judged on
    tolerance: float = 0.05  # a loss 5 % above the window's best is a wobble
    step_spike: float = 3.0  # a step 3x the window's median norm is a spike
    patience: int = 3  # calm rounds before giving a notch back (doubles after a failed give-back)
    max_patience: int = 48
    min_server_lr: float = 0.25


@dataclass(frozen=True)
class Adjustment:
    round: int
    knob: str
    old: float
    new: float
    reason: str


class ConvergenceMonitor:
    def __init__(self, knobs: Knobs, config: FeedbackConfig | None = None, min_epochs: int = 1) -> None:
        self.config = config or FeedbackConfig()
        self.min_epochs = min(min_epochs, knobs.max_epochs)  # the fewest local epochs it lowers max-epochs to
        self.ceiling = knobs  # what the run was configured with: never relaxed beyond
        self.knobs = knobs
        self._losses: deque[float] = deque(maxlen=self.config.window)
        self._norms: deque[float] = deque(maxlen=self.config.window)
        self._calm = 0
        self._patience = self.config.patience
        self._just_relaxed = False

    def observe(self, rnd: int, loss: float, step_norm: float) -> list[Adjustment]:
        """Feed one round's global loss and server-step norm; return the changes it caused."""
        c = self.config
        why = None
        if not math.isfinite(loss):
            why = "loss is not finite"
        elif self._losses and loss > min(self._losses) * (1 + c.tolerance):
            why = f"loss {loss:.4f} is {loss / min(self._losses) - 1:.0%} above the recent best"
        elif len(self._norms) >= 2 and step_norm > c.step_spike * float(np.median(self._norms)):
            why = f"server step {step_norm:.3g} is {step_norm / float(np.median(self._norms)):.1f}x the recent median"
        if math.isfinite(loss):
            self._losses.append(loss)
        if math.isfinite(step_norm) and step_norm > 0:
            self._norms.append(step_norm)
        relaxed, self._just_relaxed = self._just_relaxed, False
        if why is not None:
            self._calm = 0
            if relaxed:
                self._patience = min(c.max_patience, 2 * self._patience)
                why += f"; next give-back after {self._patience} calm rounds"
            return self._move(rnd, tighter=True, reason=why)
        self._calm += 1
        if self._calm >= self._patience and self.knobs != self.ceiling:
            self._calm = 0
            self._just_relaxed = True
            return self._move(rnd, tighter=False, reason=f"{self._patience} calm rounds")
        return []

    def _move(self, rnd: int, tighter: bool, reason: str) -> list[Adjustment]:
        k, top = self.knobs, self.ceiling
        if tighter:
            new = Knobs(max(self.min_epochs, k.max_epochs - 1), max(0, k.max_staleness - 1),
                        max(self.config.min_server_lr, k.server_lr / 2))
        else:
            new = Knobs(min(top.max_epochs, k.max_epochs + 1), min(top.max_staleness, k.max_staleness + 1),
                        min(top.server_lr, k.server_lr * 2))
        changes = [Adjustment(rnd, name, getattr(k, name), getattr(new, name), reason)
                   for name in ("max_epochs", "max_staleness", "server_lr") if getattr(k, name) != getattr(new, name)]
        self.knobs = new
        return changes
