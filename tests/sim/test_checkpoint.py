"""A fleet run with faulty devices, killed with SIGKILL mid-run and resumed, ends exactly as an
uninterrupted one — and the faulty devices' updates never reached the model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.slow
ROUNDS = "2"


def _simulate(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgesched", "simulate", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}


def test_a_run_killed_mid_round_and_resumed_ends_with_the_same_bytes(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    common = ["--fleet", "lab-20", "--rounds", ROUNDS, "--bad-updates", "0.2"]
    # The uninterrupted run trains in-process (the same bytes as on Ray) beside the one to be killed.
    uninterrupted = subprocess.Popen(_simulate(*common, "--out", str(whole), "--engine", "in-process"),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    # Its own process group, so SIGKILL takes the driver and Ray's workers down together, as a power cut would.
    victim = subprocess.Popen(_simulate(*common, "--out", str(broken)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=_env(), start_new_session=True)
    deadline = time.monotonic() + 300
    while not (broken / "checkpoint.bin").exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # into the next round: its partial logs must be cut back on resume
    assert victim.poll() is None, "the run ended before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not (broken / "summary.json").exists()
    _, stderr = uninterrupted.communicate(timeout=600)
    assert uninterrupted.returncode == 0, stderr[-2000:]

    resumed = subprocess.run(_simulate("--resume", str(broken)), capture_output=True, text=True, env=_env(),
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stderr
    assert (broken / "model.npz").read_bytes() == (whole / "model.npz").read_bytes()
    for log in ("events.jsonl", "decisions.jsonl"):
        assert (broken / log).read_bytes() == (whole / log).read_bytes(), log
    assert not (broken / "checkpoint.bin").exists()  # a finished run keeps no checkpoint

    summary = json.loads((whole / "summary.json").read_text())
    # Which corruptions come (NaN, refused; 100x, clipped) depends on the draws and the schedule;
    # each kind's handling is tested in tests/core/test_validate.py.
    assert sum(summary["refused_updates"].values()) + summary["clipped_updates"] >= 1
    with np.load(whole / "model.npz") as model:
        assert all(np.all(np.isfinite(model[k])) for k in model.files)
    assert summary["final_accuracy"] > 0.6
