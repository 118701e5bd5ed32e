"""A board's side of compressed jobs: the model rebuilt from a difference, the update sent in fewer bits.

The gateway sends the global model as the difference from a copy the board holds (named by a
tag) and the board keeps what it rebuilt under the job's new tag (edgesched.core.downlink); its
update goes back in the job's width with what rounding dropped kept for the next job
(edgesched.core.compress.ErrorFeedback). A SuperNode starts a fresh process for every job, so
both live on disk: the last two rebuilt copies and the residual, in the board's state folder,
one folder per run (a new run's model starts from nothing).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from edgesched.core.compress import ErrorFeedback, decode
from edgesched.core.downlink import NO_BASE
from edgesched.errors import EdgeschedError
from edgesched.files import atomic_write
from edgesched.flower.messages import (
    BASE_MISSING,
    DOWNLINK_BASE,
    DOWNLINK_BITS,
    DOWNLINK_TAG,
    UPLINK_BITS,
    packed_record,
    unpacked,
)

HELD_COPIES = 2  # a reply lost on its way costs nothing: the gateway still names the older copy
RESIDUAL = "residual.npz"

Weights = dict[str, np.ndarray]


def is_compressed(job: ConfigRecord) -> bool:
    return DOWNLINK_BITS in job


def rebuild(arrays: ArrayRecord, job: ConfigRecord, shapes: dict[str, tuple[int, ...]], folder: Path) -> Weights:
    """The model a compressed job carries: its difference added to the copy it names, kept under
    the job's tag. Raises EdgeschedError (the job's error reply) if the board lacks that copy."""
    keys = list(shapes)
    change = decode(unpacked(arrays, keys), list(shapes.values()), int(job[DOWNLINK_BITS]))
    base_tag = str(job[DOWNLINK_BASE])
    base = {k: np.zeros(s, np.float32) for k, s in shapes.items()} if base_tag == NO_BASE \
        else _load(folder / _held_name(base_tag))
    if base is None or [b.shape for b in base.values()] != [c.shape for c in change]:
        raise EdgeschedError(f"{BASE_MISSING}: {base_tag}")
    rebuilt = {k: np.asarray(base[k] + c) for k, c in zip(keys, change, strict=True)}  # 0-d stays an array
    _save(folder / _held_name(str(job[DOWNLINK_TAG])), rebuilt)
    held = sorted(folder.glob("held-*.npz"), key=lambda p: p.stat().st_mtime_ns)
    for old in held[:-HELD_COPIES]:
        old.unlink(missing_ok=True)
    return rebuilt


def compress_update(start: Weights, trained: Weights, steps: int, job: ConfigRecord,
                    folder: Path) -> tuple[ArrayRecord, ConfigRecord]:
    """The reply's arrays for a compressed job of `steps` local steps: the change in its width,
    plus what earlier jobs' rounding held back; and the record that says so."""
    bits = int(job[UPLINK_BITS])
    keys = list(start)
    saved = _load(folder / RESIDUAL)
    feedback = ErrorFeedback(list(saved.values()) if saved is not None else None)
    packed = feedback.compress([trained[k] - start[k] for k in keys], bits, steps)
    if feedback.residual is None:
        (folder / RESIDUAL).unlink(missing_ok=True)
    else:
        _save(folder / RESIDUAL, dict(zip(keys, feedback.residual, strict=True)))
    return packed_record(keys, packed), ConfigRecord({"bits": bits})


def _held_name(tag: str) -> str:
    return f"held-{hashlib.sha256(tag.encode()).hexdigest()[:16]}.npz"


def _save(path: Path, weights: Weights) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue(), mode=0o600)


def _load(path: Path) -> Weights | None:
    """Arrays saved by `_save`; None if missing or unreadable (a board's disk is not trusted either)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError):
        return None
