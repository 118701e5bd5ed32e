"""Many devices' latest heartbeats as columns, gathered once per plan (numpy only).

A plan reads a handful of numbers from every registered device's heartbeat: its load and
clock for the predictor, its battery and memory for the planner, its link and throttling for
the risk model. At 100,000 devices, reading them field by field from Python objects costs more
than all the arithmetic, so each heartbeat carries its numbers as a ready row
(`Heartbeat.readings`) and a plan stacks the rows into one table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgesched.core.telemetry import NET_TYPES, READINGS, Heartbeat

# A device without a heartbeat: no load, nothing else known, a link of unknown kind.
_SILENT = tuple(0.0 if name == "cpu_percent" else float(NET_TYPES.index("unknown")) if name == "net_type"
                else math.nan for name in READINGS)


class Readings:
    """Column `name` of `READINGS` for each device (nan where unknown; flags 0 or 1; `net_type`
    as an index into `NET_TYPES`)."""

    def __init__(self, heartbeats: Sequence[Heartbeat | None]) -> None:
        rows = [_SILENT if hb is None else hb.readings for hb in heartbeats]
        self.table = np.array(rows, dtype=np.float64).reshape(len(rows), len(READINGS))

    def __getitem__(self, name: str) -> np.ndarray:
        column: np.ndarray = self.table[:, READINGS.index(name)]
        return column

    def take(self, index: Sequence[int] | np.ndarray) -> Readings:
        """The devices at `index`, in that order."""
        taken = Readings(())
        taken.table = self.table[np.asarray(index, dtype=np.int64)]
        return taken
