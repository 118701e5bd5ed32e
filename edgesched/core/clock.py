"""Time as the engine sees it: a `Clock`, and the event queue behind a virtual one.

The engine never reads the time or sleeps by itself: it asks its clock. On a gateway that is
the wall clock (edgesched.flower.run); on one machine, virtual time (edgesched.simulations.clock),
kept in an `EventQueue`: a heap of `(time, seq, event)`. An own heap rather than SimPy: nothing
in the simulator is a process that blocks; the engine drives time by waiting. The `seq` counter
makes ties come out in the order they were scheduled, so a seed gives the same order on any host.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Protocol

from edgesched.core.events import Event as Moment


class Clock(Protocol):
    virtual: bool  # True: simulated seconds, recorded as the steps' virtual time

    def now(self) -> float: ...

    def wait(self, until: float) -> None:
        """Return at `until`, or earlier if a reply may have arrived."""

    def mark(self, event: Moment) -> None:
        """Note a moment of the run now (a virtual fleet logs it to events.jsonl)."""

    def expect(self, at: float, event: Moment) -> None:
        """Note a moment to come; it is marked when time passes it."""


@dataclass(frozen=True, order=True)
class Scheduled:
    time: float
    seq: int
    item: Any = field(compare=False)  # what happens then: a typed record the queue's owner handles


class EventQueue:
    """Scheduled items, popped in (time, scheduling order); `now` is the last popped time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Scheduled] = []
        self._seq = 0  # a plain int, not itertools.count: a checkpoint pickles the queue

    def schedule(self, time: float, item: Any) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule {item!r} at {time} before now ({self.now})")
        heapq.heappush(self._heap, Scheduled(time, self._seq, item))
        self._seq += 1

    def pop_next(self, time: float) -> Scheduled | None:
        """The next item due at or before `time`, or None (the clock then stands at `time`).

        One at a time, so handling an item may schedule another that is also due.
        """
        if self._heap and self._heap[0].time <= time:
            scheduled = heapq.heappop(self._heap)
            self.now = max(self.now, scheduled.time)
            return scheduled
        self.now = max(self.now, time)
        return None

    def __len__(self) -> int:
        return len(self._heap)
