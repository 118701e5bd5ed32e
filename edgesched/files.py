"""Files that a crash never leaves half-written, run directories one process writes at a time,
logs a resumed run continues where it stopped, and checkpoints that load no code: checksummed,
owner-only, and read by an unpickler that knows only the classes a run's state is made of."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
from pathlib import Path
from typing import IO, Any, TypeVar

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


def hold_lock(path: Path, busy: str) -> IO[bytes]:
    """An exclusive lock on `path` for this process, held while the returned file stays open (at
    most the process's life); `busy` is the one-line error when another process holds it. Two
    processes writing one run directory would interleave its logs and race on its checkpoint's
    rename. A POSIX lock, held per process: the holder may open the directory again, as a run
    cut off and resumed within one process does."""
    f = path.open("ab")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        f.close()
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise ConfigError(busy) from None
        raise
    return f


def atomic_write(path: Path, payload: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `payload` so that a crash at any instant leaves the old file or the new
    one, never a torn one: write a temporary file (`mode`, before a byte is in it), fsync it,
    rename it over, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
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
    """`state` to `path` atomically, readable by its owner alone: a header line (magic, format,
    the payload's length and SHA-256) and the payload, a pickle that `read_checkpoint` loads
    without running code."""
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    header = json.dumps({"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()})
    atomic_write(path, MAGIC + header.encode() + b"\n" + payload, mode=0o600)


def read_checkpoint(path: Path, kind: type[T]) -> T:
    """The `kind` written to `path`; a one-line error for a foreign, damaged or hostile file, or
    one of another checkpoint format (`kind.format`: raised whenever a saved class changes)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the checkpoint ({exc.strerror})") from None
    if not raw.startswith(MAGIC):
        raise ConfigError(f"{path}: not an edgesched checkpoint (or one written before checkpoints were checksummed)")
    header, _, payload = raw[len(MAGIC):].partition(b"\n")
    try:
        meta = json.loads(header)
        intact = len(payload) == meta["bytes"] and hashlib.sha256(payload).hexdigest() == meta["sha256"]
    except (ValueError, TypeError, KeyError):
        intact = False
    if not intact:
        raise ConfigError(f"{path}: damaged (its checksum does not match); nothing was loaded")
    try:
        state = _SafeUnpickler(io.BytesIO(payload)).load()
    except _Forbidden as exc:
        raise ConfigError(f"{path}: refers to {exc}, which no checkpoint holds; refused unread") from None
    except Exception as exc:  # a well-formed header over a payload that is not ours: one line
        raise ConfigError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(state, kind):
        raise ConfigError(f"{path}: not a {kind.__name__} of this version of edgesched")
    # The instance's own field, not the class default a pickle from before the field would show.
    written, reads = vars(state).get("format"), getattr(kind, "format", None)
    if written != reads:
        raise ConfigError(f"{path}: written by another version of edgesched (checkpoint format {written}, "
                          f"this version reads {reads})")
    return state


class _Forbidden(Exception):
    """A checkpoint names something outside what checkpoints hold."""


class _SafeUnpickler(pickle.Unpickler):
    """Loads the classes a checkpoint holds and nothing else: a crafted file cannot name
    `os.system` or any other callable. Allowed are the classes of the modules that make up a
    run's state (`STATE_MODULES`), none of which does I/O when built, and the few helpers
    numpy, Flower and the standard library pickle their objects with (`HELPERS`)."""

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in HELPERS:
            return super().find_class(module, name)
        if module in STATE_MODULES and "." not in name and isinstance(found := super().find_class(module, name), type):
            return found
        raise _Forbidden(full)


MAGIC = b"edgesched-checkpoint 1\n"
STATE_MODULES = frozenset({
    "edgesched.config", "edgesched.server.checkpoint", "edgesched.flower.nodes", "edgesched.trace",
    *(f"edgesched.core.{m}" for m in ("aggregate", "agreement", "clock", "compress", "decisions", "downlink",
                                      "engine", "events", "feedback", "fleet", "pace", "plan", "predict", "records",
                                      "registry", "risk", "scheduler", "telemetry", "transport", "validate")),
    *(f"edgesched.core.policies.{m}" for m in ("edgesched", "fedavg", "fedbuff")),
    *(f"edgesched.simulations.{m}" for m in ("catalog", "checkpoint", "clock", "devices", "fleet", "heartbeats",
                                             "oracle", "transport")),
})
HELPERS = frozenset({
    "builtins.set", "builtins.frozenset", "collections.Counter", "collections.deque", "collections.OrderedDict",
    "pathlib.PosixPath", "numpy.dtype", "numpy.ndarray", "numpy._core.numeric._frombuffer",
    "numpy.core.numeric._frombuffer", "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar",
    "numpy.random._pickle.__bit_generator_ctor", "numpy.random._pickle.__generator_ctor",
    "numpy.random._pcg64.PCG64", "numpy.random._generator.Generator", "numpy.random.bit_generator.SeedSequence",
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence",
    *(f"flwr.app.message.{m}.{f}" for m in ("arrayrecord", "configrecord", "metricrecord", "recorddict")
      for f in ("_check_key", "_check_value")),
    "flwr.app.message.array.Array", "flwr.app.message.arrayrecord.ArrayRecord",
    "flwr.app.message.configrecord.ConfigRecord", "flwr.app.message.metricrecord.MetricRecord",
    "flwr.app.message.recorddict.RecordDict", "flwr.app.message.message.Message", "flwr.app.metadata.Metadata",
    "flwr.app.error.Error",
})
