"""Files that a crash never leaves half-written, and logs a resumed run continues where it stopped."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import IO, TypeVar

from edgesched.errors import ConfigError

T = TypeVar("T")


def open_log(path: Path, resume_at: int | None = None, newline: str | None = None) -> IO[str]:
    """A log file to append to: new, or cut back to `resume_at` bytes (what a checkpoint saw)."""
    if resume_at is None:
        return path.open("w", newline=newline)
    f = path.open("r+", newline=newline)
    f.truncate(resume_at)
    f.seek(resume_at)
    return f


def atomic_write(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` so that a crash at any instant leaves the old file or the new
    one, never a torn one: write a temporary file, fsync it, rename it over, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_checkpoint(path: Path, state: object) -> None:
    """Pickle `state` to `path` atomically."""
    atomic_write(path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def read_checkpoint(path: Path, kind: type[T]) -> T:
    """The `kind` pickled at `path`; a one-line error for a damaged or foreign file, or one of
    another checkpoint format (`kind.format`: raised whenever a pickled class changes).

    A checkpoint is a pickle: read only those you trust, as with any pickle."""
    try:
        state = pickle.loads(path.read_bytes())
    except Exception as exc:  # a foreign or damaged file: say so in one line
        raise ConfigError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(state, kind):
        raise ConfigError(f"{path}: not a {kind.__name__} of this version of edgesched")
    # The instance's own field, not the class default a pickle from before the field would show.
    written, reads = vars(state).get("format"), getattr(kind, "format", None)
    if written != reads:
        raise ConfigError(f"{path}: written by another version of edgesched (checkpoint format {written}, "
                          f"this version reads {reads})")
    return state
