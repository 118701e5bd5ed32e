"""Update validation before aggregation (numpy only).

One bad update can wreck the global model in a single server step: a board with failing
memory sends NaNs, a stale client build sends tensors of another shape, a buggy or hostile
device sends a delta a thousand times too large. Every update is checked before it may
count: its tensors must match the global model's shapes and dtypes and be finite, its
reported work must make sense, and its size per local step must be within `norm_limit`
times the median of recently accepted updates — larger ones are clipped to that limit or
refused, as configured. Steps are counted as FedNova counts them under the clients'
momentum, so a long job's momentum-built speed does not look like an attack. A device whose updates are refused
`strikes` times within `strike_window_s` is quarantined for `quarantine_s`: the planner gives
it no work meanwhile, so a broken board stops costing the fleet slots and traffic.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesched.aggregate import momentum_steps

NORM_ACTIONS = ("clip", "refuse")


@dataclass(frozen=True)
class GuardConfig:
    norm_limit: float = 10.0  # a per-step norm this many times the recent median is absurd
    on_large_norm: str = "clip"  # "clip": scale it down to the limit; "refuse": drop it
    client_momentum: float = 0.9  # the clients' SGD momentum (edgesched.training)
    history: int = 100  # accepted per-step norms the median is taken over
    min_history: int = 5  # norms are judged only once this many are known
    strikes: int = 3  # refusals within the window that quarantine a device
    strike_window_s: float = 3600.0
    quarantine_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.on_large_norm not in NORM_ACTIONS:
            raise ValueError(f"on_large_norm must be one of {', '.join(NORM_ACTIONS)}")
        if self.norm_limit <= 1 or self.strikes < 1:
            raise ValueError("need norm_limit > 1 and strikes >= 1")


@dataclass(frozen=True)
class Verdict:
    delta: list[np.ndarray] | None  # what may be aggregated; None: refused
    reason: str | None = None  # why it was refused, or "clipped"
    quarantined: bool = False  # this refusal put the device in quarantine


class UpdateGuard:
    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()
        self.refused: Counter[str] = Counter()  # reason -> updates refused for it
        self.clipped = 0
        self._norms: deque[float] = deque(maxlen=self.config.history)
        self._strikes: dict[str, list[float]] = {}
        self._quarantine: dict[str, float] = {}  # device -> until

    def check(self, device: str, trained: Sequence[np.ndarray], base: Sequence[np.ndarray], steps: int,
              now: float) -> Verdict:
        """Judge a job's trained weights against the global model it started from."""
        reason = _malformed(trained, base, steps)
        if reason is not None:
            return self.refuse(device, reason, now)
        delta = [b - t for b, t in zip(base, trained, strict=True)]
        norm = math.sqrt(sum(float(np.sum(np.square(d, dtype=np.float64))) for d in delta))
        per_step = norm / momentum_steps(steps, self.config.client_momentum)
        known = len(self._norms) >= self.config.min_history
        limit = self.config.norm_limit * float(np.median(self._norms)) if known else math.inf
        if 0 < limit < per_step:
            if self.config.on_large_norm == "refuse":
                return self.refuse(device, "norm", now)
            self.clipped += 1
            self._norms.append(limit)
            return Verdict([(d * (limit / per_step)).astype(d.dtype) for d in delta], "clipped")
        self._norms.append(per_step)
        return Verdict(delta)

    def refuse(self, device: str, reason: str, now: float) -> Verdict:
        """Count a refusal (also for checks made before the weights are read, e.g. size)."""
        self.refused[reason] += 1
        window = [t for t in self._strikes.get(device, []) if now - t < self.config.strike_window_s] + [now]
        quarantine = len(window) >= self.config.strikes
        if quarantine:
            self._quarantine[device] = now + self.config.quarantine_s
            window = []
        self._strikes[device] = window
        return Verdict(None, reason, quarantine)

    def quarantined(self, device: str, now: float) -> bool:
        return self._quarantine.get(device, -math.inf) > now


def _malformed(trained: Sequence[np.ndarray], base: Sequence[np.ndarray], steps: int) -> str | None:
    """Why these weights cannot be aggregated at all, or None."""
    if steps < 1:
        return "bad_metrics"
    if len(trained) != len(base) or any(t.shape != b.shape for t, b in zip(trained, base, strict=False)):
        return "shape"
    if any(t.dtype != b.dtype for t, b in zip(trained, base, strict=True)):
        return "dtype"
    if not all(np.all(np.isfinite(t)) for t in trained):
        return "not_finite"
    return None
