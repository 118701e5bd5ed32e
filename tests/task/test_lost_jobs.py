"""A job whose device dies is dropped, and the drop is stamped no earlier than the death."""

from __future__ import annotations

from edgesched.config import RunConfig
from edgesched.predict import Predictor
from edgesched.scheduler import DeviceView, Scheduler, SchedulerConfig
from edgesched.server.semi_async import _drop_gone, _Sent

from .test_plan_wait import StepClock


class SlowFleet:
    """Consulting it takes `call_s` (a gateway asks the SuperLink); the device dies at `dies_at`."""

    def __init__(self, clock: StepClock, dies_at: float, call_s: float) -> None:
        self.clock, self.dies_at, self.call_s = clock, dies_at, call_s

    def session(self, device: str, now: float) -> int | None:
        self.clock.t += self.call_s  # a Last Will may come in meanwhile
        return None if self.clock.t >= self.dies_at else 1


def test_a_drop_is_stamped_after_the_death_that_caused_it():
    cfg = RunConfig.from_mapping({"clients": 1, "fraction-train": 1.0, "strategy": "edgesched"})
    scheduler = Scheduler(SchedulerConfig.from_run(cfg), Predictor(4 * 10_000))
    scheduler.start_round(1)
    [job] = scheduler.plan(1, 0.0, [DeviceView("pi", 600)])
    scheduler.dispatched("m1", job, 0.0, None, None)
    clock = StepClock()
    clock.t = 10.0
    pending = {"m1": _Sent("m1", "pi", 1, 1)}
    fleet = SlowFleet(clock, dies_at=10.1, call_s=0.3)  # dies while the gateway asks
    assert _drop_gone(scheduler, fleet, pending, clock) == 1
    assert not pending
    [lost] = [d for d in scheduler.log if d["kind"] == "outcome"]
    assert lost["outcome"] == "lost" and lost["reason"] == "device offline"
    assert lost["t"] >= fleet.dies_at  # stamped when the loop knew, not when it began to ask
