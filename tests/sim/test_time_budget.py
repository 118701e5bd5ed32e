"""A time budget ends every strategy at the same virtual moment: no step starts after it."""

from __future__ import annotations

import csv

import pytest
from flwr.supercore.task_identity import TaskIdentity

from edgesched.simulations import fleet_run
from edgesched.simulations.fleet import load_fleet

from .test_resume import FLEET


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


@pytest.mark.parametrize("strategy", ["fedavg", "edgesched"])  # Flower's own loop and the engine's
def test_a_run_stops_at_the_first_step_that_ends_past_its_budget(tmp_path, capsys, strategy):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.replace("rounds = 4", "rounds = 1000"))
    spec = load_fleet(str(path)).with_overrides(strategy=strategy, time_budget=300.0)
    summary = fleet_run.simulate_fleet(spec, tmp_path / "run", engine="in-process")
    ends = [float(r["virtual_seconds"]) for r in csv.DictReader((tmp_path / "run" / "rounds.csv").open())]
    assert 1 < len(ends) < 1000 and ends[-1] >= 300.0 > ends[-2]
    assert summary["time_budget_s"] == 300.0 and summary["rounds"] == len(ends)
    progress = capsys.readouterr().err  # measured in virtual seconds, not against the step cap
    assert "until 300 virtual s" in progress and f"virtual {ends[-1]:.0f}/300 s" in progress
    assert "/1000" not in progress
