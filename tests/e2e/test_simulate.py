"""A real federated run through the CLI: Flower's simulation engine, real data, real training."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from edgesched import data
from edgesched.export import evaluate_onnx
from edgesched.tasks import build_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fmnist_run(tmp_path_factory, fmnist_dir):
    out = tmp_path_factory.mktemp("runs") / "fmnist"
    args = ["simulate", "--data-dir", str(fmnist_dir), "--rounds", "3", "--seed", "1", "--out", str(out)]
    result = subprocess.run([sys.executable, "-m", "edgesched", *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_accuracy_rises_well_above_chance(fmnist_run):
    out, _ = fmnist_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["failed_jobs"] == 0 and summary["clients_trained"] == 10
    assert summary["final_accuracy"] > 0.6  # chance is 0.1
    assert summary["model_macs_per_sample"] == 3_024_384 and summary["model_parameters"] == 215_370
    rows = list(csv.DictReader((out / "rounds.csv").open()))
    accuracies = [float(r["accuracy"]) for r in rows]
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    assert accuracies[-1] > accuracies[0]
    assert all(int(r["replied"]) == 10 for r in rows)


def test_every_job_reports_its_speed(fmnist_run):
    out, _ = fmnist_run
    jobs = list(csv.DictReader((out / "jobs.csv").open()))
    assert len(jobs) == 30 and {int(j["partition"]) for j in jobs} == set(range(10))
    for job in jobs:
        samples, seconds = int(job["samples"]), float(job["seconds"])
        assert samples > 0 and seconds > 0
        assert float(job["samples_per_second"]) == pytest.approx(samples / seconds, rel=1e-6)


def test_run_directory_is_complete(fmnist_run):
    out, result = fmnist_run
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == "fmnist" and config["clients"] == 10 and config["partitioner"] == "dirichlet"
    weights = np.load(out / "model.npz")
    expected = build_model("fmnist").state_dict()
    assert set(weights.files) == set(expected)
    assert all(weights[k].shape == tuple(v.shape) for k, v in expected.items())
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "final accuracy" in result.stdout
    assert "round 3/3" in result.stderr  # progress lines when not on a terminal


def test_same_seed_same_model_bytes(tmp_path):
    """A run repeats exactly: same seed, byte-identical weights and per-round metrics."""
    outputs = [tmp_path / "a", tmp_path / "b"]
    args = ["simulate", "--dataset", "digits", "--rounds", "2", "--seed", "7", "--out"]
    runs = [subprocess.Popen([sys.executable, "-m", "edgesched", *args, str(out)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for out in outputs]  # side by side
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-2000:]
    a, b = outputs
    assert (a / "model.npz").read_bytes() == (b / "model.npz").read_bytes()
    columns = ("round", "accuracy", "loss", "train_loss", "samples")
    rows = [[{k: r[k] for k in columns} for r in csv.DictReader((o / "rounds.csv").open())] for o in outputs]
    assert rows[0] == rows[1]


def test_the_adaptive_scheduler_runs_over_flowers_engine(tmp_path):
    """`--strategy edgesched` without a fleet: the gateway's loop over the engine's real Grid.
    Each round's model is also exported as ONNX, and scores as the round's record says."""
    args = ["simulate", "--dataset", "digits", "--rounds", "4", "--strategy", "edgesched", "--out", str(tmp_path),
            "--onnx-every-round"]
    result = subprocess.run([sys.executable, "-m", "edgesched", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["strategy"] == "edgesched" and summary["rounds"] == 4
    accuracy = [float(r["accuracy"]) for r in csv.DictReader((tmp_path / "rounds.csv").open())]
    assert accuracy[-1] > max(0.5, accuracy[0] + 0.2)  # first jobs may land a round late: Ray starts slowly
    decisions = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    counted = [d for d in decisions if d["kind"] == "outcome" and d["outcome"] == "counted"]
    assert counted and all(d["actual_s"] > 0 for d in counted)
    assert (tmp_path / "decisions.png").exists()
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [f"round-000{r}.onnx" for r in (1, 2, 3, 4)]
    test = data.load("digits")
    for rnd in (1, 4):
        _, onnx_accuracy = evaluate_onnx(tmp_path / "onnx" / f"round-000{rnd}.onnx", test.x_test_raw, test.y_test)
        assert onnx_accuracy == pytest.approx(accuracy[rnd - 1], abs=1e-4)


COMPARED = """
name = "pair-6"
seed = 0
target_accuracy = 0.6

[data]
dataset = "digits"
partitioner = "iid"

[training]
rounds = 3
clients_per_round = 3
local_epochs = 2
round_timeout_s = 60.0

[dynamics]
dropout = 0.3

[[devices]]
board = "rpi4"
count = 3
network = "wifi"

[[devices]]
board = "phone-low"
count = 3
network = "mobile"
"""


def test_compare_runs_the_same_fleet_under_another_strategy_and_draws_both(tmp_path):
    (tmp_path / "pair-6.toml").write_text(COMPARED)
    out = tmp_path / "runs" / "pair-6-edgesched-now"
    done = subprocess.run([sys.executable, "-m", "edgesched", "simulate", "--fleet", str(tmp_path / "pair-6.toml"),
                           "--engine", "in-process", "--compare", "fedavg", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    twin = tmp_path / "runs" / "pair-6-fedavg-now"
    mine, theirs = (json.loads((d / "summary.json").read_text()) for d in (out, twin))
    assert (mine["strategy"], theirs["strategy"]) == ("edgesched", "fedavg")
    assert mine["clients"] == theirs["clients"] == 6 and theirs["rounds"] == 3
    assert (out / "compare.png").stat().st_size > 10_000
    lines = done.stdout.splitlines()
    assert any(line.split()[:1] == ["edgesched"] for line in lines) and any(
        line.split()[:1] == ["fedavg"] for line in lines), done.stdout
    assert f"edgesched dashboard {out}" in done.stdout
