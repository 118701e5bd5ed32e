"""Virtual fleets end to end: FedAvg and edgesched in virtual time, real training, same seed same bytes."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from edgesched.tasks import build_model

pytestmark = pytest.mark.slow


def _simulate(out, *args: str) -> dict:
    return _simulate_side_by_side({out: args})[out]


def _simulate_side_by_side(runs: dict) -> dict:
    """Run several simulations at once ({run directory: arguments}); their summaries."""
    procs = {out: subprocess.Popen([sys.executable, "-m", "edgesched", "simulate", "--out", str(out), *args],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for out, args in runs.items()}
    for proc in procs.values():
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
    return {out: json.loads((out / "summary.json").read_text()) for out in runs}


def test_same_seed_gives_byte_identical_events_and_model_on_either_engine(tmp_path):
    args = ("--fleet", "lab-20", "--rounds", "2", "--seed", "4", "--dropout", "0.3", "--strategy", "fedavg")
    runs = _simulate_side_by_side({tmp_path / "a": args, tmp_path / "b": (*args, "--engine", "in-process")})
    a, b = runs[tmp_path / "a"], runs[tmp_path / "b"]
    for name in ("events.jsonl", "model.npz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a["virtual_seconds"] == b["virtual_seconds"] > 0
    events = [json.loads(line) for line in (tmp_path / "a" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "dropout" for e in events)  # 30 % dropout really dropped some
    times = [e["t"] for e in events]
    assert times == sorted(times)


def test_edgesched_gives_the_same_bytes_over_the_embedded_broker(tmp_path):
    args = ("--fleet", "lab-20", "--rounds", "3", "--seed", "4", "--dropout", "0.3", "--strategy", "edgesched",
            "--engine", "in-process")
    runs = _simulate_side_by_side({tmp_path / "a": args, tmp_path / "b": (*args, "--broker", "embedded")})
    a, b = runs[tmp_path / "a"], runs[tmp_path / "b"]
    for name in ("events.jsonl", "decisions.jsonl", "model.npz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert json.loads((tmp_path / "b" / "config.json").read_text())["telemetry"] == "embedded"
    assert a["telemetry_dropped"] == b["telemetry_dropped"] == {}
    decisions = [json.loads(line) for line in (tmp_path / "a" / "decisions.jsonl").read_text().splitlines()]
    assert {d["kind"] for d in decisions} >= {"round", "plan", "outcome"}
    assert (tmp_path / "a" / "decisions.png").exists()


@pytest.mark.parametrize("strategy", ["fedavg", "edgesched"])
@pytest.mark.parametrize("fleet", ["campus-100", "phones-1000"])  # lab-20: benchmarks.contenders --quick runs all
def test_every_strategy_runs_on_every_shipped_fleet(tmp_path, fleet, strategy):
    # In-process: Ray would add its start-up, and the engine changes no byte (tested above).
    summary = _simulate(tmp_path, "--fleet", fleet, "--rounds", "1", "--strategy", strategy, "--engine", "in-process")
    assert summary["fleet"] == fleet and summary["strategy"] == strategy and summary["rounds"] == 1
    assert summary["virtual_seconds"] > 0 and summary["device_seconds"] > 0
    # Real updates arrived and were aggregated (accuracy after one round depends on the fleet:
    # a phone holds 60 samples, two SGD steps).
    jobs = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert jobs and all(int(j["samples"]) > 0 for j in jobs)
    initial = build_model("fmnist", seed=0).state_dict()
    final = np.load(tmp_path / "model.npz")
    assert any(not np.array_equal(final[k], v.numpy()) for k, v in initial.items())
    for name in ("events.jsonl", "rounds.csv", "jobs.csv", "model.npz", "accuracy.png", "accuracy_vs_time.png",
                 "timeline.png"):
        assert (tmp_path / name).exists(), name
