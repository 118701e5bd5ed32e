"""What the adaptive scheduler sees of the fleet reaches its decisions: churn and throttling.

Each test drives the policy as the engine does (a round's first look at the fleet) and fails if
the wire from the registry's view to the risk model or the predictor is cut."""

from __future__ import annotations

import pytest

from edgesched.config import RunConfig
from edgesched.core import policies
from edgesched.core.decisions import Selected
from edgesched.core.fleet import DeviceView
from edgesched.core.predict import Predictor
from edgesched.core.telemetry import Heartbeat

from .fakes import Fleet, ScriptedTransport, StepClock


def policy(k: int = 2) -> policies.EdgeschedPolicy:
    cfg = RunConfig.from_mapping({"clients": k, "strategy": "edgesched", "min-round-share": 0.01})
    return policies.edgesched(cfg, Predictor(4 * 10_000, {"pi": 1e-3}))


def look(p: policies.EdgeschedPolicy, fleet: Fleet, step: int, t: float) -> None:
    """A round begins and the policy looks at the fleet (and plans, if it can)."""
    p.begin_step(step, t)
    p.dispatch(t, fleet, ScriptedTransport(StepClock(), {}), {})


def test_a_device_that_keeps_leaving_is_judged_likelier_to_leave_mid_job():
    p = policy()
    fleet = Fleet(3)
    for step in range(1, 13):  # d1 is away every other round; d0 and d2 never leave
        fleet.gone = {"d1"} if step % 2 else set()
        look(p, fleet, step, 60.0 * step)
    risk = p.scheduler.risk
    assert risk.risk("d1", 120.0, None) > risk.risk("d0", 120.0, None) + 0.05
    assert risk.risk("d0", 120.0, None) == pytest.approx(risk.risk("d2", 120.0, None))


class BoardFleet(Fleet):
    """Two identical boards; `pi`'s clock drops to `pi_mhz` (throttled) after its first heartbeat."""

    def __init__(self) -> None:
        super().__init__(2)
        self.pi_mhz = 1500.0
        self.t = 0.0

    def views(self, now: float) -> list[DeviceView]:
        return [DeviceView(d, 600, _hb(d, now, 1500.0 if d == "pj" else self.pi_mhz), "pi") for d in ("pi", "pj")]


def _hb(device: str, t: float, mhz: float) -> Heartbeat:
    return Heartbeat(device_id=device, session=1, seq=int(t) + 1, sent_at=t, cpu_percent=0.0, load1=0.0,
                     mem_available_mb=2000.0, mem_total_mb=4000.0, cpu_freq_mhz=mhz, throttled=mhz < 1500.0)


def test_a_board_reporting_a_throttled_clock_is_planned_slower_and_given_less_work():
    p, fleet = policy(), BoardFleet()
    look(p, fleet, 1, 0.0)  # both at full clock
    fleet.pi_mhz = 1000.0  # pi is hot now
    look(p, fleet, 2, 60.0)
    predictor = p.scheduler.predictor
    hot, cool = _hb("pi", 60.0, 1000.0), _hb("pi", 60.0, 1500.0)
    assert predictor.predict("pi", hot).seconds_per_sample == pytest.approx(
        1.5 * predictor.predict("pi", cool).seconds_per_sample)
    work = {d.device: d.samples for d in p.log if isinstance(d, Selected) and d.round == 2}
    assert work["pi"] < work["pj"]  # equal finish: the slower board gets less to do


def test_a_device_leaving_during_its_job_is_the_jobs_loss_not_churn():
    risk = policy().scheduler.risk
    for t in (0.0, 60.0):
        risk.note_presence("d0", True, t)
        risk.note_presence("d1", True, t, busy=t > 0)  # d1 got a job at the second look
    risk.note_presence("d0", False, 120.0)  # left between jobs: churn
    risk.note_presence("d1", False, 120.0, busy=True)  # left with its job: counted by note_job
    assert risk.risk("d0", 120.0, None) > risk.risk("d1", 120.0, None)
