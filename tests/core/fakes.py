"""Hand-made worlds for the engine: a clock that jumps, a fleet of views, a transport that obeys a script."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgesched.core.engine import Engine, EngineState, Evaluate, Policy
from edgesched.core.events import Event
from edgesched.core.fleet import DeviceView
from edgesched.core.records import JobMetrics, JobRecord, Model, RoundRecord
from edgesched.core.transport import Bounds, Order, Reply


class StepClock:
    """Virtual time that jumps straight to whatever it is asked to wait for (or the next reply)."""

    virtual = True

    def __init__(self) -> None:
        self.t = 0.0
        self.marks: list[tuple[float, Event]] = []
        self.wake_at: list[float] = []  # times a reply lands: a wait returns by then

    def now(self) -> float:
        return self.t

    def wait(self, until: float) -> None:
        later = [t for t in self.wake_at if t > self.t]
        self.t = min([until, *later])

    def mark(self, event: Event) -> None:
        self.marks.append((self.t, event))

    def expect(self, at: float, event: Event) -> None:
        self.marks.append((at, event))


class Fleet:
    """`online` of `n` devices d0, d1, ... are online, with `samples` each; the rest are away."""

    def __init__(self, n: int, online: int | None = None, samples: int = 60) -> None:
        self.n = n
        self.online = n if online is None else online
        self.samples = samples
        self.gone: set[str] = set()

    def views(self, now: float) -> list[DeviceView]:
        return [DeviceView(f"d{i}", self.samples) for i in range(self.online) if f"d{i}" not in self.gone]

    def session(self, device: str, now: float) -> int | None:
        return None if device in self.gone else 1

    def seen(self, node: int, device_id: str) -> None:
        pass

    def size(self) -> int:
        return self.n


@dataclass
class Sent:
    job_id: str
    device: str
    step: int
    order: Order
    model: list[np.ndarray]
    at: float


@dataclass
class ScriptedTransport:
    """Each device trains `delta` off the model it got and replies after `seconds[device]` (never, if
    missing); `partition` is the device's number, its data 60 x (partition + 1) samples. A device
    in `claims` reports those figures instead of the true ones (a liar)."""

    clock: StepClock
    seconds: dict[str, float]
    delta: float = 1.0
    sent: list[Sent] = field(default_factory=list)
    claims: dict[str, dict[str, float]] = field(default_factory=dict)

    def send(self, device: str, step: int, order: Order, model: list[np.ndarray], deadline: float | None) -> str:
        job_id = f"j{len(self.sent) + 1}"
        self.sent.append(Sent(job_id, device, step, order, model, self.clock.now()))
        if device in self.seconds:
            self.clock.wake_at.append(self.clock.now() + self.seconds[device])
        return job_id

    def bounds(self, device: str, order: Order) -> Bounds:
        partition = int(device.removeprefix("d"))
        return Bounds.of(order, partition, 60 * (partition + 1), local_epochs=1, batch_size=32)

    def collect(self, job_ids: Sequence[str], max_bytes: float) -> list[Reply]:
        due = [s for s in self.sent if s.job_id in job_ids and s.device in self.seconds
               and s.at + self.seconds[s.device] <= self.clock.now()]
        return [self._reply(s) for s in sorted(due, key=lambda s: s.at + self.seconds[s.device])]

    def _reply(self, s: Sent) -> Reply:
        partition = int(s.device.removeprefix("d"))
        metrics = JobMetrics(partition, samples=60, steps=2, num_examples=60 * (partition + 1), seconds=1.0,
                             samples_per_second=60.0, loss=0.5)
        metrics = dataclasses.replace(metrics, **self.claims.get(s.device, {}))
        trained = [w - self.delta * (partition + 1) for w in s.model]
        return Reply(s.job_id, partition + 1, s.device, trained=trained, metrics=metrics)

    def reachable(self, now: float) -> list[str]:
        return sorted(self.seconds, key=lambda d: int(d.removeprefix("d")))

    def next_change(self, now: float) -> float:
        return math.inf


def run(policy: Policy, transport: ScriptedTransport, fleet: Fleet, steps: int, weights: Model | None = None,
        until: float | None = None, overlap: bool = False,
        evaluate: Evaluate | None = None) -> tuple[EngineState, list[tuple[RoundRecord, list[JobRecord]]]]:
    """Run the engine; the records of each step. A model scores (the sum of its first array, 50 %)
    unless `evaluate` says otherwise."""
    state = EngineState.start(weights or {"w": np.zeros(3, dtype=np.float32)})
    records: list[tuple[RoundRecord, list[JobRecord]]] = []
    engine = Engine(policy, transport, transport.clock, fleet, evaluate or (lambda w: (float(np.sum(w[0])), 0.5)),
                    lambda record, jobs, model: records.append((record, jobs)), lambda: 0.0, overlap=overlap)
    engine.run(state, steps, until)
    return state, records
