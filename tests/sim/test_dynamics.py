"""Heat, battery, the diurnal pattern, and the virtual devices' telemetry into the registry."""

from __future__ import annotations

import dataclasses
import math

import pytest

from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import REJOIN_S, VirtualFleet, diurnal
from edgesched.simulations.fleet import load_fleet
from edgesched.simulations.heartbeats import InProcessBus, RegistryFleetView, VirtualTelemetry

MACS, BYTES = 3_024_384, 4 * 215_370


def _fleet(name: str = "campus-100", **dynamics: object) -> VirtualFleet:
    spec = load_fleet(name)
    quiet = {"background_load": 0.0, "dropout": 0.0, "availability": False, **dynamics}
    spec = dataclasses.replace(spec, dynamics=dataclasses.replace(spec.dynamics, **quiet))
    return VirtualFleet(spec, load_catalog(), MACS, BYTES)


def _first(fleet: VirtualFleet, board: str) -> int:
    return next(d.index for d in fleet.devices if d.board.name == board)


def test_a_pi4_slows_down_when_hot_and_a_cooled_pi5_does_not():
    fleet = _fleet()
    pi4, pi5 = _first(fleet, "rpi4"), _first(fleet, "rpi5")
    samples = 600_000  # ~11 min of training on a Pi 4: long enough to reach 80 C
    full4 = fleet.devices[pi4].board.train_seconds(MACS, samples)
    job4 = fleet.job(pi4, 0.0, samples)
    cool_for = 240.0 * math.log((86.0 - 50.0) / (86.0 - 80.0))  # from 50 C toward 86 C, tau 240 s
    assert job4.throttled and job4.compute_s == pytest.approx(cool_for + (full4 - cool_for) * 1500 / 1000)
    assert fleet.devices[pi4].temperature(job4.compute_start + job4.compute_s - 1) == pytest.approx(80.0)
    job5 = fleet.job(pi5, 0.0, samples)
    assert not job5.throttled
    assert job5.compute_s == pytest.approx(fleet.devices[pi5].board.train_seconds(MACS, samples))
    # It cools between jobs: an hour later a short job runs at full speed again.
    later = fleet.job(pi4, job4.end + 3600.0, 600)
    assert not later.throttled and fleet.devices[pi4].temperature(job4.end + 3600.0) < 55.0


def test_heat_can_be_switched_off():
    fleet = _fleet(thermal=False)
    pi4 = _first(fleet, "rpi4")
    job = fleet.job(pi4, 0.0, 600_000)
    assert not job.throttled and job.compute_s == pytest.approx(fleet.devices[pi4].board.train_seconds(MACS, 600_000))


def test_training_drains_a_phone_faster_than_idling_and_a_flat_phone_is_offline():
    fleet = _fleet()
    phones = [d for d in fleet.devices if d.power is not None]
    assert phones and all(d.board.name.startswith("phone") for d in phones)
    a, b = [d for d in phones if not d.plugged and d.next_plug_toggle > 7200][:2]
    a.battery = b.battery = (0.0, 50.0)
    fleet.job(a.index, 0.0, 1_000_000)  # an hour-long job
    assert a.charge(3000.0, fleet.dyn) < b.charge(3000.0, fleet.dyn) < 50.0
    b.battery = (3000.0, 0.1)
    assert b.is_up(3000.0, fleet.dyn)
    assert not b.is_up(4000.0, fleet.dyn)  # 0.4 W empties 0.1 % of 15 Wh in ~14 s


def test_a_job_that_outlasts_the_battery_is_lost():
    fleet = _fleet()
    phone = next(d for d in fleet.devices if d.power is not None and not d.plugged and d.next_plug_toggle > 7200)
    phone.battery = (0.0, 1.0)
    job = fleet.job(phone.index, 0.0, 1_000_000)
    assert not job.delivers and job.cause == "battery" and job.drop_at < job.end


def test_charging_refills_the_battery():
    fleet = _fleet()
    phone = next(d for d in fleet.devices if d.power is not None and d.plugged and d.next_plug_toggle > 1800)
    phone.battery = (0.0, 20.0)
    assert phone.charge(1800.0, fleet.dyn) == pytest.approx(20.0 + 1800 * (10.0 - 0.4) / (15 * 3600) * 100)


def test_the_diurnal_pattern_keeps_devices_online_longer_at_night():
    spec = load_fleet("campus-100")
    dyn = dataclasses.replace(spec.dynamics, diurnal=True, start_hour=0.0)
    assert diurnal(0.0, dyn) == pytest.approx(1.5) and diurnal(12 * 3600.0, dyn) == pytest.approx(0.5)
    assert diurnal(0.0, spec.dynamics) == 1.0  # off unless the fleet asks for it
    fleet = VirtualFleet(dataclasses.replace(spec, dynamics=dataclasses.replace(dyn, battery=False)), load_catalog(),
                         MACS, BYTES)
    phones = [d.index for d in fleet.devices if d.board.name.startswith("phone")]
    night = sum(sum(i in set(fleet.online(h * 3600.0 + m * 600.0)) for i in phones)
                for h in (22, 23, 24, 25, 26) for m in range(6))
    day = sum(sum(i in set(fleet.online(h * 3600.0 + m * 600.0)) for i in phones)
              for h in (34, 35, 36, 37, 38) for m in range(6))
    assert night > 1.3 * day


def test_heartbeats_reach_the_registry_and_a_dropout_is_seen_at_once():
    fleet = _fleet(dropout=1.0)
    registry = DeviceRegistry(RegistryConfig(fleet="campus-100", heartbeat_interval=60.0))
    telemetry = VirtualTelemetry(fleet, registry, InProcessBus())
    view = RegistryFleetView(telemetry, [600] * fleet.spec.size)
    for device in fleet.devices:
        assert telemetry.heartbeat(device, 0.0)
    views = {v.device: v for v in view.views(0.0)}
    assert len(views) == 100 and not registry.dropped
    phone = next(v for v in views.values() if v.board == "phone-mid")
    assert phone.heartbeat.battery_percent is not None and phone.heartbeat.net_type == "cellular"
    pi4 = next(v for v in views.values() if v.board == "rpi4")
    assert pi4.heartbeat.temp_c == pytest.approx(50.0) and pi4.heartbeat.cpu_freq_mhz == 1500.0

    device = fleet.devices[fleet.index[pi4.device]]
    job = fleet.job(device.index, 10.0, 600)
    assert not job.delivers and view.session(pi4.device, 10.0) == 1
    telemetry.last_will(device, job.drop_at, job.session)  # the broker's Will, at the drop
    assert view.session(pi4.device, job.drop_at) is None
    back = job.drop_at + REJOIN_S
    assert telemetry.heartbeat(device, back)  # the restarted agent announces a new session
    assert view.session(pi4.device, back) == 2
