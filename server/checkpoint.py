"""A gateway's checkpoint: written after every server step into `checkpoint-dir`, read on restart.

It holds whose run it is (the config), where the engine stands (model, versions, jobs in flight,
steps so far), the policy (the scheduler with all it learned), what the gateway learned of
Flower's nodes, and the run directory's log sizes. It is written owner-only and checksummed,
and read without running code (edgesched.files): a damaged or crafted file is a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgesched.config import RunConfig
from edgesched.core.engine import EngineState
from edgesched.core.policies import Policy
from edgesched.errors import ConfigError
from edgesched.files import read_checkpoint, write_checkpoint
from edgesched.flower.nodes import FleetMemory
from edgesched.flower.run import Saved

CHECKPOINT = "gateway-checkpoint.bin"
CHECKPOINT_FORMAT = 4  # raised whenever a class the checkpoint pickles changes incompatibly


@dataclass
class GatewayCheckpoint:
    config: RunConfig
    state: EngineState
    policy: Policy
    fleet: FleetMemory
    logs: dict[str, int] | None = None  # the run directory's logs' sizes (RunRecorder.offsets)
    format: int = CHECKPOINT_FORMAT


def path(cfg: RunConfig) -> Path | None:
    return Path(cfg.checkpoint_dir) / CHECKPOINT if cfg.checkpoint_dir else None


def saved_run(cfg: RunConfig) -> GatewayCheckpoint | None:
    """This run's checkpoint in `checkpoint-dir`, if a previous start of it left one."""
    where = path(cfg)
    if where is None or not where.exists():
        return None
    saved = read_checkpoint(where, GatewayCheckpoint)
    if saved.config != cfg:
        raise ConfigError(f"{where} holds a checkpoint of another run (other settings); move it away to start afresh")
    return saved


def save(cfg: RunConfig, saved: Saved, logs: dict[str, int] | None) -> None:
    where = path(cfg)
    assert where is not None
    where.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(where, GatewayCheckpoint(cfg, saved.state, saved.policy, saved.fleet, logs))


def remove(cfg: RunConfig) -> None:
    """The run is complete: nothing to go on from."""
    where = path(cfg)
    if where is not None:
        where.unlink(missing_ok=True)
