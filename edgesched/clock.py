"""Virtual time: a discrete-event queue with deterministic ties.

An own heap rather than SimPy: the simulator never needs processes that block; the server
loop drives time itself (dispatch a round, then consume its events up to the round's end), so
a heap of `(time, seq, event)` is all it takes. The `seq` counter makes ties come out in the
order they were scheduled, so a seed gives the same event order on any host.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class Event:
    time: float
    seq: int
    kind: str = field(compare=False)
    data: dict[str, Any] = field(compare=False, default_factory=dict)


class EventQueue:
    """Scheduled events, popped in (time, scheduling order); `now` is the last popped time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Event] = []
        self._seq = 0  # a plain int, not itertools.count: a checkpoint pickles the queue

    def schedule(self, time: float, kind: str, **data: Any) -> Event:
        if time < self.now:
            raise ValueError(f"cannot schedule {kind} at {time} before now ({self.now})")
        event = Event(time, self._seq, kind, data)
        self._seq += 1
        heapq.heappush(self._heap, event)
        return event

    def pop_until(self, time: float) -> list[Event]:
        """All events due at or before `time`, in order; the clock then stands at `time`."""
        due = []
        while self._heap and self._heap[0].time <= time:
            due.append(heapq.heappop(self._heap))
        self.now = max(self.now, time)
        return due

    def pop_next(self, time: float) -> Event | None:
        """The next event due at or before `time`, or None (the clock then stands at `time`).

        One at a time, so handling an event may schedule another that is also due.
        """
        if self._heap and self._heap[0].time <= time:
            event = heapq.heappop(self._heap)
            self.now = max(self.now, event.time)
            return event
        self.now = max(self.now, time)
        return None

    def __len__(self) -> int:
        return len(self._heap)
