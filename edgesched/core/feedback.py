"""Convergence feedback: tell a noisy loss from a diverging one, and steer only on divergence.

The global test loss of federated training is noisy: on label-skewed data each step leans
toward the few devices in it, and the loss swings by 5-15 % from one step to the next while
the model improves (hapt-30's loss rises in a third of its steps under every strategy). Reading
each rise as instability held the server step at a quarter for most of a run. So the monitor
measures the loss's own noise and calls the training unstable only when:
- the loss is not finite; or
- it blew up: `blowup` times the best recent level in one go; or
- it rose and stayed up: the median of the last three losses sits above the best such median
  of the window by more than `z` times the noise (and at least `tolerance`). The noise is the
  standard deviation of the window's successive log-loss changes: the swings are heavy-tailed
  (mostly small, now and then 7-10 %), and a robust spread that ignored the large ones read
  the next large one as divergence. It is judged once `min_history` losses are in.

When unstable, it lowers, one notch each, the most local epochs, the staleness it accepts and
the server's step size (halved, down to `min_server_lr`, and never raised by it). Local epochs
go no lower than `min_epochs`, FedAvg's own: the epochs above it are what makes local models
drift apart, and cutting below it starved training. After `patience` calm steps it gives one
notch back, up to the configured values; if the step right after giving back is unstable, the
patience doubles, so a fleet that cannot take the configured values stops being tried at them
every few steps. Every change is returned with its reason so the decision log can show why.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass

FLOOR = 1e-12  # losses are judged in log space; a loss of 0 (or below) counts as this


@dataclass(frozen=True)
class Knobs:
    max_epochs: int
    max_staleness: int
    server_lr: float


@dataclass(frozen=True)
class FeedbackConfig:
    window: int = 10  # steps of history the noise and the best level are judged on
    min_history: int = 5  # losses needed before a rise is weighed against the noise
    z: float = 3.0  # a sustained rise beyond this many noise deviations is divergence
    tolerance: float = 0.05  # ... and beyond 5 % in any case
    blowup: float = 2.0  # a loss twice the best recent level is divergence at once
    patience: int = 3  # calm steps before giving a notch back (doubles after a failed give-back)
    max_patience: int = 48
    min_server_lr: float = 0.25  # the least the server step is halved to (at or above the configured one: never)


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
        self._logs: deque[float] = deque(maxlen=self.config.window)  # log losses
        self._calm = 0
        self._patience = self.config.patience
        self._just_relaxed = False

    def observe(self, rnd: int, loss: float) -> list[Adjustment]:
        """Feed one step's global loss; return the changes it caused."""
        c = self.config
        if math.isfinite(loss):
            self._logs.append(math.log(max(loss, FLOOR)))
            why = self._diverging()
        else:
            why = "loss is not finite"
        relaxed, self._just_relaxed = self._just_relaxed, False
        if why is not None:
            self._calm = 0
            if relaxed:
                self._patience = min(c.max_patience, 2 * self._patience)
                why += f"; next give-back after {self._patience} calm steps"
            return self._move(rnd, tighter=True, reason=why)
        self._calm += 1
        if self._calm >= self._patience and self.knobs != self.ceiling:
            self._calm = 0
            self._just_relaxed = True
            return self._move(rnd, tighter=False, reason=f"{self._patience} calm steps")
        return []

    def noise(self) -> float | None:
        """The loss's step-to-step noise, in log units (None: too little history)."""
        logs = list(self._logs)
        if len(logs) < self.config.min_history:
            return None
        return statistics.pstdev(b - a for a, b in itertools.pairwise(logs))

    def _diverging(self) -> str | None:
        c, logs = self.config, list(self._logs)
        levels = [statistics.median(logs[max(0, i - 2):i + 1]) for i in range(len(logs))]
        best = min(levels[:-1], default=logs[-1])
        if logs[-1] - best > math.log(c.blowup):
            return f"loss {math.exp(logs[-1]):.4f} is {math.exp(logs[-1] - best):.1f}x the recent best"
        noise = self.noise()
        if noise is None:
            return None
        rise = levels[-1] - best
        if rise > max(math.log1p(c.tolerance), c.z * noise):
            return (f"loss has stayed {math.expm1(rise):.0%} above the recent best, beyond its noise "
                    f"({math.expm1(noise):.1%} a step)")
        return None

    def _move(self, rnd: int, tighter: bool, reason: str) -> list[Adjustment]:
        k, top = self.knobs, self.ceiling
        if tighter:
            new = Knobs(max(self.min_epochs, k.max_epochs - 1), max(0, k.max_staleness - 1),
                        max(min(self.config.min_server_lr, top.server_lr), k.server_lr / 2))
        else:
            new = Knobs(min(top.max_epochs, k.max_epochs + 1), min(top.max_staleness, k.max_staleness + 1),
                        min(top.server_lr, k.server_lr * 2))
        changes = [Adjustment(rnd, name, getattr(k, name), getattr(new, name), reason)
                   for name in ("max_epochs", "max_staleness", "server_lr") if getattr(k, name) != getattr(new, name)]
        self.knobs = new
        return changes
