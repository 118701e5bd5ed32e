"""Virtual devices: deterministic per seed, calibrated compute, dropouts and availability."""

import dataclasses
from types import SimpleNamespace

import pytest

from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import load_fleet

MACS, BYTES = 3_024_384, 4 * 215_370


def _fleet(name="campus-100", **dynamics) -> VirtualFleet:
    spec = load_fleet(name)
    if dynamics:
        spec = dataclasses.replace(spec, dynamics=dataclasses.replace(spec.dynamics, **dynamics))
    return VirtualFleet(spec, load_catalog(), MACS, BYTES)


def test_same_seed_same_fleet_behaviour():
    a, b = _fleet(), _fleet()
    assert a.online(5000.0) == b.online(5000.0)
    assert [a.job(i, 5000.0, 600) for i in range(0, 100, 7)] == [b.job(i, 5000.0, 600) for i in range(0, 100, 7)]


def test_compute_time_follows_the_calibrated_board_without_slowdowns():
    fleet = _fleet("lab-20", background_load=0.0)
    board = load_catalog().boards["rpi5"]
    rpi5 = next(d.index for d in fleet.devices if d.board.name == "rpi5")
    job = fleet.job(rpi5, 0.0, 3000)
    assert job.compute_s == pytest.approx(3 * MACS * 3000 / (board.gmacs_per_s * 1e9))


def test_a_device_that_drops_mid_job_never_delivers():
    fleet = _fleet(dropout=1.0)
    jobs = [fleet.job(i, 0.0, 600) for i in fleet.online(0.0)]
    assert jobs and not any(j.delivers for j in jobs)
    assert all(j.start <= j.drop_at <= j.end for j in jobs)
    assert all(j.compute_spent_s <= j.compute_s for j in jobs)


def test_phones_come_and_go_while_plugged_in_boards_stay():
    fleet = _fleet(battery=False)
    jetsons = [d.index for d in fleet.devices if d.board.name.startswith("jetson")]
    phones = [d.index for d in fleet.devices if d.board.name.startswith("phone")]
    seen_online = {i: 0 for i in phones}
    for hour in range(24):
        online = set(fleet.online(hour * 3600.0))
        assert set(jetsons) <= online
        for i in phones:
            seen_online[i] += i in online
    share = sum(seen_online.values()) / (24 * len(phones))
    assert 0.3 < share < 0.7  # online half the time: 1 h on, 1 h off on average


def test_availability_can_be_switched_off():
    fleet = _fleet(availability=False, dropout=0.0)
    assert len(fleet.online(12345.0)) == 100


def test_mobile_links_use_the_measured_flash_distributions():
    flash = {(c[0], c[1]) for c in load_catalog().flash_clients}
    fleet = _fleet()
    phones = [d for d in fleet.devices if d.network.flash]
    assert phones and all(d.down in flash for d in phones)


def test_the_oracle_foresees_the_very_job_a_device_will_run_and_disturbs_nothing():
    from edgesched.simulations.oracle import Foresight

    fleet, twin = _fleet(dropout=0.3), _fleet(dropout=0.3)
    sizes = [600] * len(fleet.devices)
    foresight = Foresight(fleet, sizes, SimpleNamespace(now=lambda: 1000.0))
    ids = [d.device_id for d in fleet.devices]
    seen = [foresight.job(i) for i in ids]
    assert [fleet.job(i, 1000.0, 600) for i in range(len(ids))] == seen  # the real draws are the foreseen ones
    assert [twin.job(i, 1000.0, 600) for i in range(len(ids))] == seen  # as if nobody had looked
    assert any(not j.delivers for j in seen) and any(j.delivers for j in seen)


def test_the_nominal_deadline_is_a_quantile_of_catalog_job_times():
    from edgesched.simulations.contenders import nominal_deadline

    fleet = _fleet("lab-20")
    sizes = [3000] * len(fleet.devices)
    times = sorted(fleet.nominal_job_s(i, 3000) for i in range(len(sizes)))
    deadline = nominal_deadline(fleet, sizes, fleet.spec.run)
    assert times[0] < deadline <= times[-1]
    assert sum(t <= deadline for t in times) >= 0.9 * len(times)


def test_the_option_contenders_reach_the_scheduler_and_pace():
    """No reserve, no absence stretch, early step, eager rounds, step fill, paced staleness and no loss utility each set
    their one knob; the hold and the spans ablations set the hold, the spans and the loss rates that gate them
    (the default prices the hold and matches spans while under 5 % of jobs are lost)."""
    from edgesched.simulations.contenders import make_policy

    fleet = _fleet("lab-20")
    sizes = [3000] * len(fleet.devices)
    kept = {}
    for strategy in ("edgesched", "edgesched-no-reserve", "edgesched-early-step", "edgesched-matched-spans",
                     "edgesched-no-absence", "edgesched-eager-rounds", "edgesched-step-fill", "edgesched-no-hold",
                     "edgesched-priced", "edgesched-no-calm", "edgesched-loss-driven", "edgesched-no-paced-staleness",
                     "edgesched-loss-utility"):
        policy = make_policy(fleet.spec.run.with_keys({"strategy": strategy}), fleet, sizes,
                             SimpleNamespace(now=lambda: 0.0))
        scheduler = policy.scheduler
        bandit = policy.pacer.config
        kept[strategy] = (scheduler.config.battery_reserve, scheduler.risk.config.battery_reserve, policy.early_step,
                          bandit.match_spans and bandit.match_max_loss, scheduler.config.plan.absence_stretch,
                          policy.eager_rounds, scheduler.config.step_fill, policy.stream_hold, policy.priced_max_loss,
                          policy.paced_staleness and scheduler.config.staleness_damping,
                          scheduler.config.plan.loss_utility)
    calm, always = ("priced", 0.05, True, False), ("always", 0.05, True, False)
    base = (20.0, 20.0, False, 0.05, 2.0, False, False)  # the default's reserves, spans, stretch, rounds and fill
    assert kept == {"edgesched": (*base, *calm),
                    "edgesched-no-reserve": (0.0, 0.0, False, 0.05, 2.0, False, False, *calm),
                    "edgesched-early-step": (20.0, 20.0, True, 0.05, 2.0, False, False, *always),
                    "edgesched-matched-spans": (20.0, 20.0, False, 1.0, 2.0, False, False, *always),
                    "edgesched-no-absence": (20.0, 20.0, False, 0.05, 1.0, False, False, *calm),
                    "edgesched-eager-rounds": (20.0, 20.0, False, 0.05, 2.0, True, False, *calm),
                    "edgesched-step-fill": (20.0, 20.0, False, 0.05, 2.0, False, True, *calm),
                    "edgesched-no-hold": (20.0, 20.0, False, False, 2.0, False, False, "never", 0.05, True, False),
                    "edgesched-priced": (20.0, 20.0, False, 0.2, 2.0, False, False, "priced", 1.0, True, False),
                    "edgesched-no-calm": (20.0, 20.0, False, False, 2.0, False, False, "always", 0.05, False, True),
                    "edgesched-loss-driven": (*base, "priced", 0.05, False, True),
                    "edgesched-no-paced-staleness": (*base, "priced", 0.05, False, False),
                    "edgesched-loss-utility": (*base, "priced", 0.05, True, True)}


def test_the_learned_pace_contenders_set_its_reward_and_blocks():
    from edgesched.simulations.contenders import make_policy

    fleet = _fleet("lab-20")
    configs = [make_policy(fleet.spec.run.with_keys({"strategy": s}), fleet, [3000] * len(fleet.devices),
                           SimpleNamespace(now=lambda: 0.0)).pacer.config
               for s in ("edgesched", "edgesched-error-reward", "edgesched-short-rounds")]
    assert [(c.reward, c.lossy_rounds_steps) for c in configs] == [("loss", 6), ("error", 6), ("loss", 3)]
