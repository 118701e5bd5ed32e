"""Checkpoints of a simulated run: written after every server step, continued with --resume.

One file holds everything the rest of the run depends on: the engine's state (global model,
the models that jobs in flight started from, the jobs in flight, the steps so far), the policy
(for the adaptive scheduler: predictor, risk, convergence feedback, validation, buffers,
decision log), the virtual clock (its event queue), the jobs on the devices' timelines and the
fault stream, the fleet (every device's state and random stream) and the registry its
heartbeats fed — in one object graph, so what they share stays shared. It also records how
long each log in the run directory was, so a resumed run cuts off whatever the stopped one
wrote after it.

It is written atomically (temporary file, fsync, rename): a run killed at any instant leaves
the previous checkpoint or the new one, never a torn one. A run resumed from step r's
checkpoint repeats exactly what the uninterrupted run did after step r, so both end with the
same model.npz, byte for byte (tests/sim/test_checkpoint.py). Every policy on edgesched's
engine writes checkpoints; Flower's own strategies run their rounds inside `Strategy.start`,
which cannot be re-entered.

It is written owner-only and checksummed, and read without running code (edgesched.files): a
damaged or crafted file is a one-line error, never a different model or someone else's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesched.core.engine import EngineState
from edgesched.core.policies import Policy
from edgesched.errors import ConfigError
from edgesched.files import read_checkpoint, write_checkpoint
from edgesched.simulations.clock import VirtualClock
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import FleetSpec
from edgesched.simulations.heartbeats import VirtualTelemetry

FILE = "checkpoint.bin"
FORMAT = 5


@dataclass
class Checkpoint:
    spec: FleetSpec
    broker: str
    state: EngineState
    policy: Policy
    clock: VirtualClock
    transport: dict[str, Any]  # VirtualTransport.snapshot()
    fleet: VirtualFleet
    telemetry: VirtualTelemetry
    logs: dict[str, int]  # run-directory file -> its size at the checkpoint
    format: int = FORMAT


def save(out_dir: Path, checkpoint: Checkpoint) -> None:
    write_checkpoint(out_dir / FILE, checkpoint)


def load(run_dir: Path) -> Checkpoint:
    """The run's last checkpoint; a clear error if there is none to continue from."""
    path = run_dir / FILE
    if (run_dir / "summary.json").exists():
        raise ConfigError(f"{run_dir} holds a finished run: nothing to resume")
    if not path.exists():
        what = "no run directory" if not run_dir.is_dir() else "no checkpoint (Flower's own strategies, fedavg " \
            "and fedprox, write none; or the run stopped before its first round)"
        raise ConfigError(f"{run_dir}: {what}")
    return read_checkpoint(path, Checkpoint)
