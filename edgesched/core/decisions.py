"""The adaptive scheduler's decisions as typed records: what decisions.jsonl holds, line by line.

Every record has `t` (seconds: virtual in a simulation), `round` and a `kind`; `to_json` gives
the line, `decision_from_json` reads one back. The fields are described in docs/scheduler.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class Decision:
    t: float
    round: int

    KIND: ClassVar[str]
    FIXED: ClassVar[dict[str, Any]] = {}  # fields every record of the class carries with one value

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, **self.FIXED, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class RoundPlanned(Decision):
    """A round was planned: its deadline and how many devices it could choose from."""

    deadline_s: float
    stretch: float
    candidates: int
    busy: int
    selected: int
    expected_updates: float
    absence_s: float  # how long devices stayed away after a lost job (edgesched.core.risk.absence_s)

    KIND: ClassVar[str] = "round"


@dataclass(frozen=True)
class Selected(Decision):
    """A device given work: how much, its predicted time and risk, how late it may count."""

    device: str
    samples: int
    steps: int
    epochs: int
    predicted_s: float  # upper quantile
    predicted_mean_s: float
    staleness: int  # rounds late it is expected
    staleness_bound: int
    risk: float
    utility: float

    KIND: ClassVar[str] = "plan"
    FIXED: ClassVar[dict[str, Any]] = {"selected": True}


@dataclass(frozen=True)
class Skipped(Decision):
    """A free device left out, and why (too_slow, battery, memory, capacity, quarantined)."""

    device: str
    reason: str

    KIND: ClassVar[str] = "plan"
    FIXED: ClassVar[dict[str, Any]] = {"selected": False}


@dataclass(frozen=True)
class Arrived(Decision):
    """A job's update came back: counted, or too stale to count; predicted against actual time."""

    device: str
    outcome: str  # "counted" or "too_stale"
    arrived_round: int
    staleness: int
    staleness_bound: int
    predicted_s: float
    actual_s: float
    error: float  # mean prediction / actual - 1
    samples: int
    bits: int = 0  # the update's width (0: float32)
    bytes_down: int = 0  # model bytes the job carried down, and its reply up
    bytes_up: int = 0

    KIND: ClassVar[str] = "outcome"


class _Ended:
    """A job that ended without an update: its outcome is its class's."""

    FIXED: ClassVar[dict[str, Any]]

    @property
    def outcome(self) -> str:
        return str(self.FIXED["outcome"])


@dataclass(frozen=True)
class Lost(_Ended, Decision):
    """A job that will never deliver: its device left, the transport failed, it was refused."""

    device: str
    reason: str
    arrived_round: int

    KIND: ClassVar[str] = "outcome"
    FIXED: ClassVar[dict[str, Any]] = {"outcome": "lost"}


@dataclass(frozen=True)
class Expired(_Ended, Decision):
    """A job past its staleness bound: it can no longer count, its device is still busy."""

    device: str
    arrived_round: int

    KIND: ClassVar[str] = "outcome"
    FIXED: ClassVar[dict[str, Any]] = {"outcome": "expired"}


@dataclass(frozen=True)
class Quarantined(Decision):
    device: str
    until: float
    reason: str

    KIND: ClassVar[str] = "quarantine"


@dataclass(frozen=True)
class Screened(Decision):
    """An update whose size was out of line at aggregation: clipped or refused."""

    device: str
    outcome: str

    KIND: ClassVar[str] = "screen"


@dataclass(frozen=True)
class Adjusted(Decision):
    """Feedback moved a knob (max_epochs, max_staleness, server_lr, deadline_stretch)."""

    knob: str
    old: float
    new: float
    reason: str

    KIND: ClassVar[str] = "adjust"


@dataclass(frozen=True)
class Paced(Decision):
    """The pace chosen for the steps from this one on (edgesched.core.pace), and why."""

    pace: str
    reason: str

    KIND: ClassVar[str] = "pace"


@dataclass(frozen=True)
class Thinned(Decision):
    """A server step on fewer updates than clients-per-round, scaled by the fleet's agreement."""

    updates: int
    agreement: float  # the recent steps' signal-to-noise ratio (edgesched.core.agreement)
    scale: float

    KIND: ClassVar[str] = "thin"


@dataclass(frozen=True)
class Released(Decision):
    """Streaming, `stream-hold = "priced"`: a device whose update waits for the step sent again,
    because holding it would idle it longer than the absence its job risks."""

    device: str
    risk: float  # that its job is lost
    absence_s: float  # how long a device stays away after a lost job (edgesched.core.risk.absence_s)
    wait_s: float | None  # predicted until the step (None: too few jobs out to bring it)

    KIND: ClassVar[str] = "release"


_CLASSES: list[type[Decision]] = [RoundPlanned, Selected, Skipped, Arrived, Lost, Expired, Quarantined, Screened,
                                  Adjusted, Paced, Thinned, Released]


def decision_from_json(line: str) -> Decision:
    """One line of decisions.jsonl as its record; ValueError for a line of no known kind."""
    data = json.loads(line)
    for cls in _CLASSES:
        if data.get("kind") == cls.KIND and all(data.get(k) == v for k, v in cls.FIXED.items()) \
                and (cls is not Arrived or data.get("outcome") in ("counted", "too_stale")):
            fields = {k: v for k, v in data.items() if k != "kind" and k not in cls.FIXED}
            return cls(**fields)
    raise ValueError(f"not a decision record: {line[:80]}")


def prediction_error(log: Sequence[Decision], after_round: int = 0) -> dict[str, Any]:
    """Median absolute % error of predicted vs actual job time, over the arrivals of jobs planned after a round."""
    errors = [abs(e.error) for e in log if isinstance(e, Arrived) and e.round > after_round]
    return {"after_round": after_round, "jobs": len(errors),
            "median_abs_pct": round(100 * float(np.median(errors)), 2) if errors else None}
