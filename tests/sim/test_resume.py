"""Every policy on the engine goes on from its checkpoint: a run stopped mid-way and resumed ends with
the same bytes as one that never stopped (in-process and on digits, so each takes seconds)."""

from __future__ import annotations

import pytest
from flwr.supercore.task_identity import TaskIdentity

from edgesched.observe import LOCK_FILE
from edgesched.simulations import checkpoint, fleet_run
from edgesched.simulations.fleet import load_fleet

FLEET = """
name = "resume"
seed = 3
target_accuracy = 0.9
[data]
dataset = "digits"
partitioner = "iid"
[training]
rounds = 4
clients_per_round = 4
lr = 0.05
round_timeout_s = 120
[dynamics]
dropout = 0.3
[[devices]]
board = "rpi4"
count = 4
network = "wifi"
[[devices]]
board = "phone-mid"
count = 4
network = "mobile"
online_s = 600
offline_s = 300
"""


class PowerCut(Exception):
    pass


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


@pytest.mark.parametrize("strategy", ["fedbuff", "deadline", "edgesched", "edgesched-compressed"])
def test_a_run_stopped_after_a_step_resumes_to_the_same_bytes(tmp_path, monkeypatch, strategy):
    path = tmp_path / "resume.toml"
    path.write_text(FLEET)
    spec = load_fleet(str(path)).with_overrides(strategy=strategy)
    fleet_run.simulate_fleet(spec, tmp_path / "whole", engine="in-process")

    save, calls = checkpoint.save, []

    def cut_at_the_third_checkpoint(out_dir, saved):
        calls.append(saved.state.step)
        if len(calls) == 3:  # step 3's records are written, its checkpoint never is
            raise PowerCut
        save(out_dir, saved)

    monkeypatch.setattr(checkpoint, "save", cut_at_the_third_checkpoint)
    with pytest.raises(PowerCut):
        fleet_run.simulate_fleet(spec, tmp_path / "cut", engine="in-process")
    monkeypatch.setattr(checkpoint, "save", save)
    saved = checkpoint.load(tmp_path / "cut")
    assert saved.state.step == 2, calls
    summary = fleet_run.simulate_fleet(saved.spec, tmp_path / "cut", saved.broker, resume=saved, engine="in-process")
    assert summary["resumed_after_round"] == 2 and summary["rounds"] == 4
    adaptive = strategy.startswith("edgesched")
    for name in ("model.npz", "events.jsonl", "jobs.csv") + (("decisions.jsonl",) if adaptive else ()):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert not (tmp_path / "whole" / LOCK_FILE).exists() and not (tmp_path / "cut" / LOCK_FILE).exists()


def test_slow_checkpoints_are_written_less_often_and_leave_the_run_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "resume.toml"
    path.write_text(FLEET)
    spec = load_fleet(str(path)).with_overrides(strategy="edgesched")
    fleet_run.simulate_fleet(spec, tmp_path / "every", engine="in-process")

    save, steps = checkpoint.save, []

    def recorded(out_dir, saved):
        steps.append(saved.state.step)
        save(out_dir, saved)

    monkeypatch.setattr(checkpoint, "save", recorded)
    monkeypatch.setattr(fleet_run, "CHECKPOINT_SLOW_S", 0.0)  # every checkpoint counts as slow
    monkeypatch.setattr(fleet_run, "CHECKPOINT_SHARE", 0.0)  # and any time spent on them as too much
    fleet_run.simulate_fleet(spec, tmp_path / "paced", engine="in-process")
    assert steps == [1]
    for name in ("model.npz", "events.jsonl", "jobs.csv", "decisions.jsonl"):
        assert (tmp_path / "paced" / name).read_bytes() == (tmp_path / "every" / name).read_bytes(), name
