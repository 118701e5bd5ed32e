"""The ClientApp's jobs on a board, handed to the board's agent through small files.

A file is the simplest hand-off that survives either process restarting: the ClientApp (a new
process per job under a SuperNode) writes its last job's speed atomically, and while a job
runs, a marker with its process's start time; the agent reads both before each heartbeat. The
speed goes out with the heartbeat; the marker keeps the board's own training out of the CPU
load it reports (`TrainingWatch`), which is meant to say what else competes with the next job.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import psutil


def job_report_path(device_id: str) -> Path:
    """Where the ClientApp leaves its last job's speed for the agent on the same board."""
    return state_dir() / f"{device_id}.job.json"


def state_dir() -> Path:
    """What a board's edgesched processes keep between jobs: EDGESCHED_STATE_DIR, else the user's
    runtime folder, else the user's state folder (~/.local/state); always its `edgesched`
    subfolder. Never the shared temp folder: whoever made /tmp/edgesched first would feed the
    agent its speeds and the ClientApp its data."""
    base = os.environ.get("EDGESCHED_STATE_DIR") or os.environ.get("XDG_RUNTIME_DIR") \
        or os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "edgesched"


def write_job_report(device_id: str, samples_per_s: float, job_s: float) -> None:
    """Atomically replace the job report (write, fsync, rename), so a reader never sees half."""
    path = job_report_path(device_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    payload = json.dumps({"train_samples_per_s": samples_per_s, "last_job_s": job_s})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".job-")
    with os.fdopen(fd, "w") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def training_path(device_id: str) -> Path:
    return state_dir() / f"{device_id}.training"


def mark_training(device_id: str) -> None:
    """Say that this process runs a job on the board, from its start (its imports load the CPU
    before training does) until it has exited: the agent checks that it still lives."""
    me = psutil.Process()
    path = training_path(device_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": me.pid, "started": me.create_time()}))


class TrainingWatch:
    """The CPU load of the board's other work: readings over intervals in which no job ran.

    `report(start, end, load)` takes a reading over [start, end] (Unix seconds) and returns the
    load to publish: the reading itself if no job's process lived during the interval, else the
    newest reading from before that process started (a job's own load, its start and its exit
    included, is not competition for the next job).
    """

    def __init__(self, device_id: str, keep: int = 30) -> None:
        self._device_id = device_id
        self._clean: list[tuple[float, float]] = []  # (end, load) of intervals without a job, oldest first
        self._keep = keep
        self._was_running = False

    def report(self, start: float, end: float, load: float) -> float:
        began = self._running_since()
        if began is not None:  # readings since its process started had its load in them
            self._clean = [(t, v) for t, v in self._clean if t < began]
        tainted = began is not None or self._was_running  # running now, or ended during the interval
        self._was_running = began is not None
        if not tainted:
            self._clean = [*self._clean[-self._keep + 1:], (end, load)]
            return load
        return self._clean[-1][1] if self._clean else load

    def _running_since(self) -> float | None:
        """When the running job's process started, or None if no job's process lives."""
        try:
            marker = json.loads(training_path(self._device_id).read_text())
            process = psutil.Process(int(marker["pid"]))
            started = float(marker["started"])
            if abs(process.create_time() - started) < 0.5 and process.status() != psutil.STATUS_ZOMBIE:
                return started
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            pass
        return None


def read_job_report(device_id: str) -> dict[str, float]:
    """The last job's figures, or {} when there is none or it is unreadable."""
    try:
        data = json.loads(job_report_path(device_id).read_text())
        return {k: float(data[k]) for k in ("train_samples_per_s", "last_job_s")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
