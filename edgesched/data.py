"""Real data sets, loaded from local files only (nothing is fetched at run time).

- Fashion-MNIST: the four IDX files (plain or .gz), as Debian's `dataset-fashion-mnist`
  installs them under /usr/share/datasets/fashion-mnist.
- UCI HAPT: raw 50 Hz accelerometer + gyroscope signals of 30 users, cut into windows of
  2.56 s (128 samples, 50 % overlap); each user is one natural client.
- digits: scikit-learn's bundled 8x8 digits, for quick runs and tests.

Loaders return float32 inputs already normalised for the models in `edgesched.models`, each
by its fixed `Normalise` (the tasks in edgesched.tasks carry it): a board's own raw readings
become model inputs the same way, and the exported ONNX model starts with that step, so a board
feeds it raw readings. The raw test inputs are kept to check an export against.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgesched.config import DATASETS
from edgesched.config import FMNIST_DIR as _FMNIST_DIR
from edgesched.errors import DataError

FMNIST_DIR = Path(_FMNIST_DIR)
HAPT_FILE = "hapt_raw_by_user.npz"
HAPT_WINDOW, HAPT_STEP = 128, 64
HAPT_TEST_SHARE = 0.2
_FMNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


@dataclass(frozen=True)
class Normalise:
    """How raw readings (pixels 0-255, sensor units) become the model's inputs: (raw / divisor -
    mean) / std in float32, with a channel axis added where the model has one."""

    divisor: float
    mean: float | np.ndarray
    std: float | np.ndarray
    channel_axis: bool = False

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        x = (raw.astype(np.float32) / self.divisor - self.mean) / self.std
        return x[:, None] if self.channel_axis else x


@dataclass(frozen=True)
class Dataset:
    """A train/test split; `groups` names each training sample's natural owner (a user);
    `x_test_raw` the test inputs as a device reads them, which the task's `normalise` turns into `x_test`."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    groups: np.ndarray | None = None
    x_test_raw: np.ndarray | None = None


FMNIST_NORMALISE = Normalise(255.0, 0.2860, 0.3530, channel_axis=True)
# Per channel (body acceleration x, y, z in g; angular velocity x, y, z in rad/s), over all 30
# users' training windows: fixed, so a board normalises its own readings as the gateway does.
HAPT_NORMALISE = Normalise(
    1.0,
    np.array([0.8022, 0.03670, 0.09573, 0.002971, -0.0005294, -0.008819], dtype=np.float32).reshape(1, 6, 1),
    np.array([0.4115, 0.4035, 0.3467, 0.4164, 0.3947, 0.2750], dtype=np.float32).reshape(1, 6, 1),
)
DIGITS_NORMALISE = Normalise(16.0, 0.5, 0.5)


@lru_cache(maxsize=4)
def load(name: str, data_dir: str | None = None) -> Dataset:
    """Load a data set by name; cached per process because simulation workers reuse it."""
    if name == "fmnist":
        return load_fmnist(Path(data_dir) if data_dir else FMNIST_DIR)
    if name == "hapt":
        if not data_dir:
            raise DataError(f"hapt needs --data-dir: the folder holding {HAPT_FILE}")
        return load_hapt(Path(data_dir))
    if name == "digits":
        return load_digits()
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (the MNIST format): magic, dims, then big-endian payload."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    payload = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if payload.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: expected {int(np.prod(dims))} values, got {payload.size}")
    return payload.reshape(dims)


def load_fmnist(folder: Path) -> Dataset:
    arrays = {key: read_idx(_find_idx(folder, stem)) for key, stem in _FMNIST_FILES.items()}

    images = FMNIST_NORMALISE
    return Dataset(
        "fmnist",
        images(arrays["x_train"]),
        arrays["y_train"].astype(np.int64),
        images(arrays["x_test"]),
        arrays["y_test"].astype(np.int64),
        num_classes=10,
        x_test_raw=arrays["x_test"],
    )


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    hint = " (on Debian: apt-get install dataset-fashion-mnist)" if folder == FMNIST_DIR else ""
    raise DataError(f"Fashion-MNIST file {stem}[.gz] not found in {folder}{hint}; point --data-dir at the folder")


def load_hapt(folder: Path) -> Dataset:
    """Window each recording session; per session and activity, the last 20 % is the test set.

    Only windows whose 128 samples all carry one label (1-12) are kept, so a window is a
    clean example of an activity or a posture transition. Sessions follow a fixed activity
    protocol, so the test share is taken from every activity of every session (the latest
    windows of each), not from the end of the session: every user and every activity is in
    both sets, and all 30 users can be clients.
    """
    path = folder / HAPT_FILE if folder.is_dir() else folder
    try:
        raw = np.load(path)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read HAPT data {path}: {exc}; point --data-dir at the folder holding {HAPT_FILE}"
        ) from exc
    sessions = sorted({m.group(1) for k in raw.files if (m := re.fullmatch(r"(u\d+_s\d+)_X", k))})
    if not sessions:
        raise DataError(f"{path} holds no uNN_sK_X arrays; is it the HAPT file?")
    parts: dict[bool, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {False: [], True: []}
    for session in sessions:
        x, y = _windows(raw[f"{session}_X"], raw[f"{session}_y"])
        user = int(session[1:3])
        is_test = np.zeros(len(y), dtype=bool)
        for label in np.unique(y):
            members = np.flatnonzero(y == label)  # in time order
            is_test[members[round(len(members) * (1 - HAPT_TEST_SHARE)):]] = True
        for test in (False, True):
            keep = is_test == test
            parts[test].append((x[keep], y[keep], np.full(int(keep.sum()), user, dtype=np.int64)))
    x_train, y_train, groups = (np.concatenate(a) for a in zip(*parts[False], strict=True))
    x_test, y_test, _ = (np.concatenate(a) for a in zip(*parts[True], strict=True))
    signals = HAPT_NORMALISE
    return Dataset("hapt", signals(x_train), y_train, signals(x_test), y_test, num_classes=12, groups=groups,
                   x_test_raw=x_test)


def _windows(signal: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut [n, 6] signals into label-pure [6, 128] windows; labels become 0-based classes."""
    starts = np.arange(0, len(signal) - HAPT_WINDOW + 1, HAPT_STEP)
    if len(starts) == 0:
        return np.empty((0, 6, HAPT_WINDOW), np.float32), np.empty(0, np.int64)
    idx = starts[:, None] + np.arange(HAPT_WINDOW)[None, :]
    window_labels = labels[idx]
    pure = (window_labels == window_labels[:, :1]).all(axis=1) & (window_labels[:, 0] >= 1)
    x = signal[idx[pure]].transpose(0, 2, 1).astype(np.float32)
    return x, window_labels[pure, 0].astype(np.int64) - 1


def load_digits() -> Dataset:
    """scikit-learn's 1,797 8x8 digits; a seeded 25 % holdout is the test set."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as exc:
        raise DataError("the digits data set needs scikit-learn: pip install scikit-learn") from exc
    bunch = sk_digits()
    pixels = DIGITS_NORMALISE
    x = pixels(bunch.data)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(len(y) * 0.75)
    tr, te = order[:cut], order[cut:]
    return Dataset("digits", x[tr], y[tr], x[te], y[te], num_classes=10, x_test_raw=bunch.data[te].astype(np.float32))
