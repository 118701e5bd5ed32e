"""An edgesched task that lives outside the package: which of three cultivars a wine comes from,
from 13 chemical measurements (the UCI Wine data, in wine.csv beside this file).

Run it by naming it, nothing in edgesched edited (docs/tasks.md):

    edgesched simulate --dataset examples/wine/wine_task.py:task --clients 4 --rounds 5

and on a fleet with `dataset = "/path/to/wine_task.py:task"` (or `wine_task:task` with this folder
on the Python path) in the run config; boards train on their own `data.csv`, laid out as
wine.csv is: the cultivar, then the 13 measurements.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from edgesched.data import Dataset, Normalise
from edgesched.tasks import Task

HERE = Path(__file__).resolve().parent
CLASSES = ("cultivar-1", "cultivar-2", "cultivar-3")
# Mean and spread of each measurement over all 178 wines: fixed, so every board scales its
# readings as the gateway does.
SCALE = Normalise(
    1.0,
    np.array([13.0, 2.336, 2.367, 19.49, 99.74, 2.295, 2.029, 0.3619, 1.591, 5.058, 0.9574, 2.612, 746.9],
             dtype=np.float32),
    np.array([0.8095, 1.114, 0.2736, 3.330, 14.24, 0.6241, 0.9960, 0.1241, 0.5707, 2.312, 0.2279, 0.7080, 314.0],
             dtype=np.float32),
)


def load(data_dir: str | None) -> Dataset:
    """wine.csv (from `data_dir`, else beside this file), a seeded quarter held out for testing."""
    path = Path(data_dir or HERE) / "wine.csv"
    rows = np.loadtxt(path, delimiter=",", skiprows=1, dtype=str)
    y = np.array([CLASSES.index(label) for label in rows[:, 0]], dtype=np.int64)
    x = rows[:, 1:].astype(np.float32)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[: len(y) * 3 // 4], order[len(y) * 3 // 4 :]
    return Dataset("wine", SCALE(x[train]), y[train], SCALE(x[test]), y[test], num_classes=len(CLASSES),
                   x_test_raw=x[test])


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, len(CLASSES)))


task = Task("wine", model, input_shape=(13,), classes=CLASSES, load=load, normalise=SCALE)
