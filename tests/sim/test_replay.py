"""The shipped trace replays the fleet it was recorded from.

simulations/traces/loopback.csv was written by a gateway during `benchmarks.real_fleet` (four
boards as real processes, each held to its share of a core; one killed and started again, one
throttled to a quarter of its share), and tests/sim/data/loopback-jobs.json holds what that run
measured: each counted job's device, finish time, samples and seconds from sending to reply,
and each board's availability as the harness made it. Replayed on the virtual fleet, each
device's availability and the median time of those jobs must be within 10 % of the recording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.replay import compare
from edgesched.simulations.fleet import load_fleet

RECORDED = json.loads((Path(__file__).parent / "data" / "loopback-jobs.json").read_text())


def test_the_recorded_loopback_fleet_replays_within_ten_percent():
    table = compare(load_fleet("replay"), RECORDED["jobs"], RECORDED["availability"])
    assert set(table) == {"pi-fast", "pi-mid", "pi-slow", "pi-restart"}
    for device, row in table.items():
        assert row["jobs"] >= 3, device
        assert row["availability_replayed"] == pytest.approx(row["availability_recorded"], rel=0.1), device
        assert row["median_job_s_replayed"] == pytest.approx(row["median_job_s_recorded"], rel=0.1), device
    slowest = max(table.values(), key=lambda row: row["median_job_s_recorded"])
    fastest = min(table.values(), key=lambda row: row["median_job_s_recorded"])
    assert slowest["median_job_s_replayed"] > 1.5 * fastest["median_job_s_replayed"]  # the boards differ, replayed
