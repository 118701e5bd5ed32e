"""The ClientApp's last job on a board, handed to the board's agent through a small file.

A file is the simplest hand-off that survives either process restarting: the ClientApp (a new
process per job under a SuperNode) writes it atomically; the agent reads it before each
heartbeat, and publishes the speed with it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


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


def read_job_report(device_id: str) -> dict[str, float]:
    """The last job's figures, or {} when there is none or it is unreadable."""
    try:
        data = json.loads(job_report_path(device_id).read_text())
        return {k: float(data[k]) for k in ("train_samples_per_s", "last_job_s")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
