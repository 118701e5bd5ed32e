"""When the scheduler loop starts a round: it waits for enough free devices, never for more than exist."""

from __future__ import annotations

from edgesched.config import RunConfig
from edgesched.predict import Predictor
from edgesched.scheduler import DeviceView, Scheduler, SchedulerConfig
from edgesched.server.semi_async import _plan


class StepClock:
    virtual = True

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait(self, until: float) -> None:
        self.t = until

    def mark(self, event: str, **data: object) -> None:
        pass


class Fleet:
    """`online` of `n` devices are online (and free); the rest are away."""

    def __init__(self, n: int, online: int | None = None) -> None:
        self.n = n
        self.online = n if online is None else online

    def views(self, now: float) -> list[DeviceView]:
        return [DeviceView(f"d{i}", 60) for i in range(self.online)]

    def size(self) -> int:
        return self.n


def plan_time(devices: int, clients_per_round: int, online: int | None = None) -> float:
    cfg = RunConfig.from_mapping({"clients": clients_per_round, "fraction-train": 1.0, "round-timeout": 600.0,
                                  "strategy": "edgesched"})
    scheduler = Scheduler(SchedulerConfig.from_run(cfg), Predictor(4 * 10_000))
    scheduler.deadline = 100.0  # a slow fleet's deadline: the loop would settle only after it
    scheduler.start_round(1)
    clock = StepClock()
    assignments, _ = _plan(scheduler, Fleet(devices, online), clock, 1, cfg, lambda: None)
    assert assignments
    return clock.t


def test_a_fleet_no_bigger_than_the_round_starts_once_all_of_it_is_free():
    # Over-selection wants more candidates than the clients per round; a fleet of exactly that
    # size can never supply them, so the round must not wait for them.
    assert plan_time(devices=10, clients_per_round=10) == 0.0
    assert plan_time(devices=4, clients_per_round=10) == 0.0


def test_a_big_enough_fleet_starts_at_once():
    assert plan_time(devices=30, clients_per_round=10) == 0.0


def test_a_round_short_of_devices_starts_with_half_of_them_after_one_deadline():
    # 30 phones, few online: waiting for all 10 would idle the free ones until others return.
    # Polled every round-timeout / 100 = 6 s: it starts at the first poll after one deadline.
    assert 100.0 <= plan_time(devices=30, clients_per_round=10, online=6) < 106.0
    assert plan_time(devices=30, clients_per_round=10, online=4) == 600.0  # under half: the round timeout
