"""A board's own training data, read from a folder it names (SuperNode node config `local-data`).

One folder, in one of three layouts (docs/tasks.md):

- `data.npz`: arrays `x` (raw readings, one sample per row, shaped like the task's raw sample)
  and `y` (class indexes 0..n-1);
- `data.csv`: one sample per line, its label first (a class name or index), then its raw
  readings flattened in C order; a first line that is not numbers is a header;
- one sub-folder per class, named as the task names its classes, holding images (.png, .jpg,
  .jpeg, .bmp); each is read in grey (raw shape H x W) or colour (H x W x 3) and resized to the
  task's raw shape (needs Pillow).

Readings are raw, as the board's sensor or camera gives them; the task's `normalise` makes
them model inputs, exactly as the gateway's evaluation data and the exported ONNX graph do.
A layout problem is one `DataError` line naming the file. `count` tells the gateway how many
samples the board holds without importing torch: its work is sized, and its update weighted,
by that figure, which every later reply must repeat.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from edgesched.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
NPZ, CSV = "data.npz", "data.csv"


def count(folder: Path) -> int:
    """How many samples the folder holds (what `read` will return), cheaply."""
    layout = _layout(folder)
    if layout == NPZ:
        with np.load(folder / NPZ) as saved:
            return len(saved["y"]) if "y" in saved.files else 0
    if layout == CSV:
        return len(_csv_rows(folder / CSV))
    return sum(1 for c in folder.iterdir() if c.is_dir() for f in c.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)


def read(folder: Path, classes: tuple[str, ...], raw_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The folder's raw readings [n, *raw_shape] (float32) and class indexes [n] (int64)."""
    layout = _layout(folder)
    if layout == NPZ:
        x, y = _read_npz(folder / NPZ)
    elif layout == CSV:
        x, y = _read_csv(folder / CSV, classes)
    else:
        x, y = _read_images(folder, classes, raw_shape)
    where = folder / layout if layout else folder
    if x.shape[1:] != raw_shape:
        raise DataError(f"{where}: samples are shaped {x.shape[1:]}, the task reads {raw_shape}")
    if len(y) == 0:
        raise DataError(f"{where}: no samples")
    if y.min() < 0 or y.max() >= len(classes):
        raise DataError(f"{where}: labels must be 0..{len(classes) - 1}, found {int(y.min())}..{int(y.max())}")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def _layout(folder: Path) -> str:
    """NPZ, CSV, or "" (class folders)."""
    if not folder.is_dir():
        raise DataError(f"local data {folder}: no such folder")
    for name in (NPZ, CSV):
        if (folder / name).is_file():
            return name
    if any(c.is_dir() for c in folder.iterdir()):
        return ""
    raise DataError(f"local data {folder}: holds neither {NPZ}, {CSV} nor a folder per class")


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path) as saved:  # allow_pickle=False: arrays only
            x, y = saved["x"], saved["y"]
    except KeyError:
        raise DataError(f"{path}: needs arrays x (readings) and y (labels)") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    if len(x) != len(y) or y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: y must be one integer label per sample of x ({len(x)} samples, y {y.shape})")
    return x, y


def _csv_rows(path: Path) -> list[list[str]]:
    try:
        with path.open(newline="") as f:
            rows = [row for row in csv.reader(f) if row]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    if rows and not _numbers(rows[0][1:]):  # a header
        rows = rows[1:]
    return rows


def _numbers(cells: list[str]) -> bool:
    try:
        [float(c) for c in cells]
    except ValueError:
        return False
    return True


def _read_csv(path: Path, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    labels, values = [], []
    for line, row in enumerate(_csv_rows(path), start=1):
        label = row[0].strip()
        if label in classes:
            labels.append(classes.index(label))
        elif label.lstrip("-").isdigit():
            labels.append(int(label))
        else:
            raise DataError(f"{path}: sample {line}: label {label!r} is neither a class ({', '.join(classes)}) "
                            f"nor an index")
        if not _numbers(row[1:]):
            raise DataError(f"{path}: sample {line}: readings must be numbers")
        values.append([float(c) for c in row[1:]])
    if len({len(v) for v in values}) > 1:
        raise DataError(f"{path}: samples have different numbers of readings")
    return np.asarray(values, dtype=np.float32), np.asarray(labels, dtype=np.int64)


def _read_images(folder: Path, classes: tuple[str, ...], raw_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DataError("a folder of images needs Pillow: pip install pillow") from None
    if len(raw_shape) not in (2, 3) or (len(raw_shape) == 3 and raw_shape[2] != 3):
        raise DataError(f"local data {folder}: images need a task that reads H x W or H x W x 3, not {raw_shape}")
    mode = "L" if len(raw_shape) == 2 else "RGB"
    x, y = [], []
    for sub in sorted(c for c in folder.iterdir() if c.is_dir()):
        if sub.name not in classes:
            raise DataError(f"{sub}: not a class of the task ({', '.join(classes)})")
        for path in sorted(f for f in sub.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES):
            try:
                with Image.open(path) as image:
                    pixels = image.convert(mode).resize((raw_shape[1], raw_shape[0]))
            except (OSError, UnidentifiedImageError) as exc:
                raise DataError(f"{path}: not a readable image ({exc})") from None
            x.append(np.asarray(pixels, dtype=np.float32))
            y.append(classes.index(sub.name))
    return np.stack(x) if x else np.empty((0, *raw_shape), np.float32), np.asarray(y, dtype=np.int64)
