"""The engine and its policies on hand-made fleets: no Flower, no torch, no broker."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgesched.config import RunConfig
from edgesched.core import policies
from edgesched.core.decisions import Lost
from edgesched.core.engine import Engine, EngineState, Job
from edgesched.core.events import DeadlinePassed, Idle, RoundEnded
from edgesched.core.predict import Predictor

from .fakes import Fleet, ScriptedTransport, StepClock, run


class Stop(Exception):
    pass


class StopAtFirstJob(ScriptedTransport):
    def send(self, *args, **kwargs) -> str:
        raise Stop


def edgesched(k: int, **over) -> policies.EdgeschedPolicy:
    """The adaptive scheduler in rounds (what these tests are about; tests/core/test_pace.py streams)."""
    cfg = RunConfig.from_mapping({"clients": k, "fraction-train": 1.0, "round-timeout": 600.0,
                                  "strategy": "edgesched", "pace": "rounds", **over})
    return policies.edgesched(cfg, Predictor(4 * 10_000))


def first_plan_at(devices: int, clients_per_round: int, online: int | None = None, **over) -> float:
    """When the adaptive scheduler starts its first round on a fleet with `online` devices up."""
    policy = edgesched(clients_per_round, **over)
    policy.scheduler.deadline = 100.0  # a slow fleet's deadline: the loop would settle only after it
    clock = StepClock()
    with pytest.raises(Stop):
        run(policy, StopAtFirstJob(clock, {}), Fleet(devices, online), steps=1)
    return clock.t


def test_a_fleet_no_bigger_than_the_round_starts_once_all_of_it_is_free():
    # Over-selection wants more candidates than the clients per round; a fleet of exactly that
    # size can never supply them, so the round must not wait for them.
    assert first_plan_at(devices=10, clients_per_round=10) == 0.0
    assert first_plan_at(devices=4, clients_per_round=10) == 0.0


def test_a_big_enough_fleet_starts_at_once():
    assert first_plan_at(devices=30, clients_per_round=10) == 0.0


def test_a_round_short_of_devices_starts_with_half_of_them_after_one_deadline():
    # 30 phones, few online: waiting for all 10 would idle the free ones until others return.
    # Looked at every round-timeout / 100 = 6 s: it starts at the first look after one deadline.
    assert 100.0 <= first_plan_at(devices=30, clients_per_round=10, online=6) < 106.0
    assert first_plan_at(devices=30, clients_per_round=10, online=4) == 600.0  # under half: the round timeout


def test_an_eager_round_starts_with_those_online_once_all_of_them_are_free():
    # eager-rounds: after one deadline, every device online free, the round starts with as few as are
    # online (only a device coming back could add to it, minutes away on a phone fleet).
    assert 100.0 <= first_plan_at(devices=30, clients_per_round=10, online=2, **{"eager-rounds": True}) < 106.0


def test_an_eager_round_short_of_devices_waits_while_a_job_online_may_still_end():
    # Two of three devices online are free after one deadline, the third still has a job out (from
    # a round before): its device may be free soon, so the round waits for half of its devices.
    policy = edgesched(10, **{"eager-rounds": True})
    policy.scheduler.deadline = 100.0
    policy.begin_step(1, now=0.0)
    transport = ScriptedTransport(StepClock(), {})
    out = {"j0": Job("j0", "d2", step=0, session=1, sent_at=-50.0)}
    assert policy.dispatch(110.0, Fleet(30, online=3), transport, out) is None
    assert policy.dispatch(110.0, Fleet(30, online=3), transport, {}) is not None


class DyingFleet(Fleet):
    """d0 dies while the gateway asks whether it is still there (asking takes `call_s`: a SuperLink call)."""

    def __init__(self, clock: StepClock, call_s: float) -> None:
        super().__init__(1)
        self.clock, self.call_s = clock, call_s
        self.died_at: float | None = None

    def session(self, device: str, now: float) -> int | None:
        if self.clock.t > 0 and self.died_at is None:
            self.died_at = self.clock.t + self.call_s / 3  # its Last Will comes in during the call
        self.clock.t += self.call_s
        return None if self.died_at is not None and self.clock.t >= self.died_at else 1


def test_a_drop_is_stamped_after_the_death_that_caused_it():
    clock = StepClock()
    fleet = DyingFleet(clock, call_s=0.3)
    policy = edgesched(1)
    run(policy, ScriptedTransport(clock, {}), fleet, steps=1)
    [lost] = [d for d in policy.log if isinstance(d, Lost)]
    assert lost.reason == "device offline"
    assert fleet.died_at is not None and lost.t >= fleet.died_at  # stamped when the engine knew, not before


def test_fedavg_waits_for_every_reply_then_averages_in_partition_order():
    clock = StepClock()
    transport = ScriptedTransport(clock, {"d0": 3.0, "d1": 1.0, "d2": 2.0})
    policy = policies.FedAvg(per_round=3, timeout=60.0, rng=np.random.default_rng(0))
    state, records = run(policy, transport, Fleet(3), steps=1)
    (record, jobs), = records
    assert clock.t == 3.0 and record.replied == 3 and record.failed == 0  # the slowest reply ended the round
    assert [j.partition for j in jobs] == [1, 2, 0]  # taken in as they came
    # d_i moves the model by i + 1 and holds 60 (i + 1) samples: (1*1 + 2*2 + 3*3) / 6
    np.testing.assert_allclose(state.model[0], -14 / 6, rtol=1e-6)
    assert (3.0, RoundEnded(1, 3)) in clock.marks and (60.0, DeadlinePassed(1)) in clock.marks


def test_fedavg_gives_up_at_its_deadline_on_a_device_that_never_answers():
    clock = StepClock()
    transport = ScriptedTransport(clock, {"d0": 1.0, "d1": 2.0, "d2": 1e9})  # d2 is far too slow
    policy = policies.FedAvg(per_round=3, timeout=60.0, rng=np.random.default_rng(0))
    state, records = run(policy, transport, Fleet(3), steps=2)
    assert [r.failed for r, _ in records] == [1, 1] and [r.replied for r, _ in records] == [2, 2]
    assert [r.virtual_seconds for r, _ in records] == [60.0, 120.0]
    assert not state.jobs  # given up on: written off, not in flight


def test_fedavg_waits_for_enough_free_devices_and_says_so():
    class Scarce(ScriptedTransport):
        def reachable(self, now: float) -> list[str]:
            return ["d0", "d1"] if now >= 50.0 else ["d0"]

        def next_change(self, now: float) -> float:
            return 50.0

    clock = StepClock()
    policy = policies.FedAvg(per_round=2, timeout=60.0, rng=np.random.default_rng(0))
    run(policy, Scarce(clock, {"d0": 1.0, "d1": 1.0}), Fleet(2), steps=1)
    assert (50.0, Idle()) in clock.marks and clock.t == 51.0


def test_fedbuff_steps_whenever_k_updates_are_in():
    clock = StepClock()
    transport = ScriptedTransport(clock, {f"d{i}": 1.0 + i for i in range(4)})
    policy = policies.FedBuff(k=2, concurrency=4, staleness_exponent=0.5, server_lr=1.0, round_timeout=600.0,
                              rng=np.random.default_rng(0))
    _, records = run(policy, transport, Fleet(4), steps=2)
    assert [r.replied for r, _ in records] == [2, 2]
    # d0 is back at work at t=2, d1 once the first step is taken: both deliver by t=3.
    assert [r.virtual_seconds for r, _ in records] == [2.0, 3.0]
    assert [(s.device, s.at) for s in transport.sent[4:6]] == [("d0", 2.0), ("d1", 2.0)]


def test_a_job_in_flight_keeps_the_model_it_started_from():
    clock = StepClock()
    transport = ScriptedTransport(clock, {"d0": 1.0, "d1": 10.0})
    policy = policies.FedBuff(k=1, concurrency=2, staleness_exponent=0.0, server_lr=1.0, round_timeout=600.0,
                              rng=np.random.default_rng(0))
    state, _ = run(policy, transport, Fleet(2), steps=3)
    late = next(s for s in transport.sent if s.device == "d1")
    assert late.step == 1 and np.all(late.model[0] == 0)  # d1's job started from the first model
    assert [job.step for job in state.jobs.values() if job.device == "d1"] == [1]
    assert set(state.versions) == {job.step for job in state.jobs.values()}  # only models still needed


def test_no_step_starts_once_the_time_budget_is_spent():
    clock = StepClock()
    transport = ScriptedTransport(clock, {"d0": 3.0, "d1": 3.0})
    policy = policies.FedAvg(per_round=2, timeout=60.0, rng=np.random.default_rng(0))
    _, records = run(policy, transport, Fleet(2), steps=100, until=7.0)
    assert [r.virtual_seconds for r, _ in records] == [3.0, 6.0, 9.0]  # the third started at 6 s, before 7


class SlowScoring:
    """An evaluation that takes a while on another thread, noting what the transport had sent when
    it started and what when the step was recorded."""

    def __init__(self, transport: ScriptedTransport) -> None:
        self.transport = transport
        self.sent_at_start: list[int] = []
        self.sent_at_record: list[int] = []

    def __call__(self, weights):
        self.sent_at_start.append(len(self.transport.sent))
        time.sleep(0.05)
        return float(np.sum(weights[0])), 0.5


@pytest.mark.parametrize("overlap", [False, True])
def test_with_overlap_the_next_jobs_go_out_while_the_last_step_is_scored(overlap: bool):
    clock = StepClock()
    transport = ScriptedTransport(clock, {"d0": 3.0, "d1": 1.0, "d2": 2.0})
    policy = policies.FedAvg(per_round=3, timeout=60.0, rng=np.random.default_rng(0))
    scoring = SlowScoring(transport)
    state = EngineState.start({"w": np.zeros(3, dtype=np.float32)})
    records = []

    def on_round(record, jobs, model):
        scoring.sent_at_record.append(len(transport.sent))
        records.append((record, float(model["w"][0])))

    Engine(policy, transport, clock, Fleet(3), scoring, on_round, lambda: 0.0, overlap=overlap).run(state, 3)
    assert [r.round for r, _ in records] == [1, 2, 3]  # every step recorded, the last one too
    # each record holds its own step's model and score, whenever it was written
    assert [w for _, w in records] == pytest.approx([-14 / 6 * k for k in (1, 2, 3)], rel=1e-6)
    assert [r.loss for r, _ in records] == pytest.approx([3 * w for _, w in records], rel=1e-6)
    assert all(n >= 3 * k for n, k in zip(scoring.sent_at_start, (1, 2, 3), strict=True))  # once it was taken
    if overlap:  # recorded only once the next step's jobs were out (the last: at the end)
        assert scoring.sent_at_record == [6, 9, 9]
    else:
        assert scoring.sent_at_record == [3, 6, 9]
