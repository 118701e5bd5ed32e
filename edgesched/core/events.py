"""Moments of a run as typed records: what a virtual fleet's events.jsonl holds, line by line.

A line is `{"t": virtual seconds, "event": kind, ...fields}`; optional fields are left out when
they do not apply (`throttled` only on a throttled compute, `late` only where a job had a hard
deadline). The engine marks the moments of its own (a step's end, a deadline, a wait for free
devices); the virtual fleet logs the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    KIND: ClassVar[str]

    def to_json(self, t: float) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps({"t": round(t, 6), "event": self.KIND, **{k: v for k, v in data.items() if v is not None}})


@dataclass(frozen=True)
class JobEvent(Event):
    """A stage of a job on its device's timeline."""

    round: int
    device: str


@dataclass(frozen=True)
class Dispatched(JobEvent):
    KIND: ClassVar[str] = "dispatch"


@dataclass(frozen=True)
class Downloaded(JobEvent):
    KIND: ClassVar[str] = "download"


@dataclass(frozen=True)
class Computed(JobEvent):
    throttled: bool | None = None  # True when heat slowed it

    KIND: ClassVar[str] = "compute"


@dataclass(frozen=True)
class Uploaded(JobEvent):
    late: bool | None = None  # past its hard deadline (None: it had none)

    KIND: ClassVar[str] = "upload"


@dataclass(frozen=True)
class DroppedOut(JobEvent):
    cause: str  # "dropout", "offline" or "battery"

    KIND: ClassVar[str] = "dropout"


@dataclass(frozen=True)
class HeartbeatSent(Event):
    device: str

    KIND: ClassVar[str] = "heartbeat"


@dataclass(frozen=True)
class Rejoined(Event):
    """A device's agent is back after a dropout, with a new session."""

    device: str

    KIND: ClassVar[str] = "rejoin"


@dataclass(frozen=True)
class DeadlinePassed(Event):
    round: int

    KIND: ClassVar[str] = "deadline"


@dataclass(frozen=True)
class RoundEnded(Event):
    round: int
    delivered: int  # updates in the step's aggregate

    KIND: ClassVar[str] = "round_end"


@dataclass(frozen=True)
class Idle(Event):
    """The server waited for devices to become free."""

    KIND: ClassVar[str] = "idle"


_CLASSES: dict[str, type[Event]] = {cls.KIND: cls for cls in (Dispatched, Downloaded, Computed, Uploaded, DroppedOut,
                                                                HeartbeatSent, Rejoined, DeadlinePassed, RoundEnded,
                                                                Idle)}


def event_from_json(line: str) -> tuple[float, Event]:
    """(virtual time, record) of one line of events.jsonl; ValueError for an unknown kind."""
    data: dict[str, Any] = json.loads(line)
    cls = _CLASSES.get(data.pop("event", None))
    if cls is None:
        raise ValueError(f"not an event record: {line[:80]}")
    t = data.pop("t")
    return t, cls(**data)
