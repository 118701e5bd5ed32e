"""Update validation before aggregation (numpy only).

One bad update can wreck the global model in a single server step: a board with failing
memory sends NaNs, a stale client build sends tensors of another shape, a buggy or hostile
device sends a delta a hundred times too large, or claims a billion steps so that FedNova
scales its update up, or a billion samples so that it outweighs the fleet. Every update is
checked twice. On arrival (`refusal`, by the engine for every strategy), its tensors must
match the global model's shapes and dtypes and be finite, and what it reports must agree
with what the gateway knows of the job (`Bounds`): the partition it was sent, that
partition's size, no more steps than the order allowed, samples that those steps can hold.
At aggregation (`screen`), its size per local step must be within `norm_limit` times the
median of recently accepted updates (at the start of a run, of the round's own) — larger
ones are refused, or clipped to the median size: a flagged update then pulls no harder than
a typical one (norm bounding, Sun et al. 2019). Steps are counted as FedNova counts them
under the clients' momentum, so a long job's momentum-built speed does not look like an
attack. A device whose updates are refused `strikes` times within `strike_window_s` is
quarantined for `quarantine_s`: the planner gives it no work meanwhile, so a broken board
stops costing the fleet slots and traffic.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesched.config import LARGE_UPDATE
from edgesched.core.aggregate import momentum_steps
from edgesched.core.records import JobMetrics
from edgesched.core.transport import Bounds


@dataclass(frozen=True)
class GuardConfig:
    norm_limit: float = 10.0  # a per-step norm this many times the recent median is absurd
    on_large_norm: str = "clip"  # "clip": scale it down to the median size; "refuse": drop it
    client_momentum: float = 0.9  # the clients' SGD momentum (edgesched.training)
    history: int = 100  # accepted per-step norms the median is taken over
    min_history: int = 5  # updates seen before their median size is the yardstick
    cold_limit: float = 1.0  # with no yardstick at all: an update may change the model by this x its norm
    strikes: int = 3  # refusals within the window that quarantine a device
    strike_window_s: float = 3600.0
    quarantine_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.on_large_norm not in LARGE_UPDATE:
            raise ValueError(f"on_large_norm must be one of {', '.join(LARGE_UPDATE)}")
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
              data_size: int, now: float) -> Verdict:
        """On arrival: can these trained weights (from `steps` on `data_size` samples) be aggregated
        at all? Returns the delta if so."""
        reason = _malformed(trained, base, steps, data_size)
        if reason is not None:
            return self.refuse(device, reason, now)
        return Verdict([b - t for b, t in zip(base, trained, strict=True)])

    def screen(self, updates: Sequence[tuple[str, Sequence[np.ndarray], int]], model: Sequence[np.ndarray],
               now: float) -> list[Verdict]:
        """At aggregation: judge the size of each (device, delta, steps) of a round, in order.

        The yardstick is the median size per local step of recently accepted updates; until
        `min_history` are known, the median of this round's (if it has three or more), and
        failing that the model's own size (`cold_limit`): no update may move the model further.
        An update beyond `norm_limit` x the median is refused or clipped to the median.
        """
        momentum = self.config.client_momentum
        sizes = [_norm(delta) / momentum_steps(steps, momentum) for _, delta, steps in updates]
        if len(self._norms) >= self.config.min_history:
            median = float(np.median(self._norms))
        elif len(sizes) >= 3:
            median = float(np.median(sizes))
        else:
            median = math.inf
            model_size = self.config.cold_limit * _norm(model)
        verdicts = []
        for (device, delta, steps), size in zip(updates, sizes, strict=True):
            if math.isfinite(median):
                limit, target = self.config.norm_limit * median, median
            else:
                limit = target = model_size / momentum_steps(steps, momentum)
            if 0 < limit < size:
                if self.config.on_large_norm == "refuse":
                    verdicts.append(self.refuse(device, "norm", now))
                    continue
                self.clipped += 1
                verdicts.append(Verdict([(d * (target / size)).astype(d.dtype) for d in delta], "clipped"))
                size = target
            else:
                verdicts.append(Verdict(list(delta)))
            self._norms.append(size)
        return verdicts

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

    def held(self, now: float) -> set[str]:
        """The devices quarantined at `now`."""
        return {device for device, until in self._quarantine.items() if until > now}


def _norm(tensors: Sequence[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum(np.square(t, dtype=np.float64))) for t in tensors))


def refusal(trained: Sequence[np.ndarray], base: Sequence[np.ndarray], metrics: JobMetrics,
            bounds: Bounds | None) -> str | None:
    """Why a reply's update may not be used at all, or None (`bounds`: what the gateway knows
    of the job, which the engine records for every job it sends; None: only its tensors and
    the plain sense of its figures can be checked)."""
    if bounds is not None:
        if metrics.partition != bounds.partition:
            return "claims_partition"
        if metrics.num_examples != bounds.examples:
            return "claims_examples"
        if not 1 <= metrics.steps <= bounds.max_steps:
            return "claims_steps"
        if not metrics.steps <= metrics.samples <= metrics.steps * bounds.batch_size:
            return "claims_samples"
    return _malformed(trained, base, metrics.steps, metrics.num_examples)


def _malformed(trained: Sequence[np.ndarray], base: Sequence[np.ndarray], steps: int, data_size: int) -> str | None:
    """Why these weights cannot be aggregated at all, or None."""
    if steps < 1 or data_size < 1:
        return "bad_metrics"
    if len(trained) != len(base) or any(t.shape != b.shape for t, b in zip(trained, base, strict=False)):
        return "shape"
    if any(t.dtype != b.dtype for t, b in zip(trained, base, strict=True)):
        return "dtype"
    if not all(np.all(np.isfinite(t)) for t in trained):
        return "not_finite"
    return None
