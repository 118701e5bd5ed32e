"""Virtual time for a fleet on one machine: the engine's Clock, an event queue, and events.jsonl.

Everything that happens at a virtual moment is an item in one queue: a stage of a job (logged
as it is reached), a device agent's heartbeat tick, its death mid-job (its Last Will), its
return, a deadline. `wait(until)` plays the queue forward to `until`, or to the next moment a
job ends if that comes first (a reply may be in, or a device gone): the engine then looks
again. Nothing here sleeps; a seed gives the same order of everything on any host.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import IO, Any

from edgesched.core.clock import EventQueue
from edgesched.core.events import DroppedOut, Event, HeartbeatSent, Rejoined
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.heartbeats import VirtualTelemetry


@dataclass(frozen=True)
class HeartbeatDue:
    """A device agent's heartbeat tick (it sends nothing while the device is down)."""

    index: int
    device: str


@dataclass(frozen=True)
class AgentDied:
    """A device vanished mid-job: its Last Will fires, and its agent restarts later."""

    event: DroppedOut
    index: int
    session: int  # the agent session that died


@dataclass(frozen=True)
class AgentBack:
    index: int
    device: str


class EventLog:
    """events.jsonl: one JSON line per moment, virtual time first."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def write(self, t: float, event: Event) -> None:
        self.file.write(event.to_json(t) + "\n")


class VirtualClock:
    virtual = True

    def __init__(self, fleet: VirtualFleet, telemetry: VirtualTelemetry, log: EventLog) -> None:
        self.fleet = fleet
        self.telemetry = telemetry
        self.log = log
        self.queue = EventQueue()
        self._ends: list[float] = []  # when jobs end (deliver or vanish): heap

    def __getstate__(self) -> dict[str, Any]:
        """For a checkpoint: everything but the open log, which a resumed run reopens."""
        return {**self.__dict__, "log": None}

    def start(self) -> None:
        """Every agent announces itself at start-up: the registry knows the fleet before the first plan."""
        for device in self.fleet.devices:
            self.queue.schedule(0.0, HeartbeatDue(device.index, device.device_id))
        self.advance(0.0)

    def now(self) -> float:
        return self.queue.now

    def wait(self, until: float) -> None:
        """Move virtual time to `until`, or to the next end of a job if that comes first."""
        while self._ends and self._ends[0] <= self.queue.now:
            heapq.heappop(self._ends)
        self.advance(min(until, self._ends[0]) if self._ends else until)

    def mark(self, event: Event) -> None:
        self.log.write(self.queue.now, event)

    def expect(self, at: float, event: Event) -> None:
        self.queue.schedule(at, event)

    def schedule(self, at: float, item: Event | AgentDied) -> None:
        self.queue.schedule(at, item)

    def job_ends_at(self, at: float) -> None:
        """A job ends then: a wait returns by that moment."""
        heapq.heappush(self._ends, at)

    def advance(self, until: float) -> None:
        """Play everything due up to `until`: agents beat and die, every moment is logged."""
        while (due := self.queue.pop_next(until)) is not None:
            self._happen(due.time, due.item)

    def _happen(self, t: float, item: Any) -> None:
        if isinstance(item, HeartbeatDue):
            self.queue.schedule(self._next_beat(t, item.index), item)
            if self.telemetry.heartbeat(self.fleet.devices[item.index], t):  # a device that is down sends nothing
                self.log.write(t, HeartbeatSent(item.device))
        elif isinstance(item, AgentBack):  # a restarted agent announces itself at once
            self.telemetry.heartbeat(self.fleet.devices[item.index], t)
            self.log.write(t, Rejoined(item.device))
        elif isinstance(item, AgentDied):
            device = self.fleet.devices[item.index]
            self.telemetry.last_will(device, t, item.session)
            self.queue.schedule(device.down_until, AgentBack(item.index, device.device_id))
            self.log.write(t, item.event)
        else:
            self.log.write(t, item)

    def _next_beat(self, t: float, index: int) -> float:
        """Devices beat at their own phase of the interval, so heartbeats spread out over time."""
        interval = self.fleet.dyn.heartbeat_s
        phase = interval * index / len(self.fleet.devices)
        return phase + (math.floor((t - phase) / interval + 1e-9) + 1) * interval  # strictly after t
