"""The oracle: edgesched's planner fed the virtual fleet's true future instead of predictions.

The benchmark's bound. For each candidate it draws the job the device would really run if sent
its whole partition now, on a copy of the device (its random streams included), so the real
run is untouched and then draws the very same numbers: the oracle knows the job's true compute
and transfer times (no uncertainty) and whether it will deliver (risk 0 or 1). What it cannot
know exactly is a job of a different size: an availability change may fall inside a longer
job and not a shorter one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from edgesched.core.clock import Clock
from edgesched.core.predict import Predictions, Predictor
from edgesched.core.readings import Readings
from edgesched.core.risk import DropoutModel, RiskConfig
from edgesched.core.telemetry import Heartbeat
from edgesched.simulations.devices import Job, VirtualFleet


class Foresight:
    """The true next job of any device at the current virtual time (cached until time moves)."""

    def __init__(self, fleet: VirtualFleet, partition_sizes: list[int], clock: Clock) -> None:
        self._fleet = fleet
        self._sizes = partition_sizes
        self._clock = clock  # the clock itself: a checkpoint holds objects, not bound methods
        self._seen: dict[str, Job] = {}
        self._at = -1.0

    def samples(self, device: str) -> int:
        return self._sizes[self._fleet.index[device]]

    def job(self, device: str) -> Job:
        now = self._clock.now()
        if now != self._at:
            self._seen, self._at = {}, now
        if device not in self._seen:
            index = self._fleet.index[device]
            real = self._fleet.devices[index]
            self._fleet.devices[index] = copy.deepcopy(real)
            try:
                self._seen[device] = self._fleet.job(index, now, self._sizes[index])
            finally:
                self._fleet.devices[index] = real
        return self._seen[device]


class OraclePredictor(Predictor):
    """Job times as they will be: per-sample compute and transfers of the device's true next job."""

    def __init__(self, foresight: Foresight, model_bytes: int) -> None:
        super().__init__(model_bytes)
        self._foresight = foresight

    def predict_all(self, devices: Sequence[str], readings: Readings, boards: Sequence[str | None]) -> Predictions:
        jobs = [self._foresight.job(device) for device in devices]
        sizes = [max(self._foresight.samples(device), 1) for device in devices]
        return Predictions(np.array([job.compute_s / size for job, size in zip(jobs, sizes, strict=True)]),
                           np.array([job.download_s + job.upload_s for job in jobs]), np.zeros(len(jobs)))

    def slowdown(self, device: str, hb: Heartbeat | None) -> float:
        return 1.0  # the true times already include the device's load and heat

    def observe_overdue(self, device: str, waited_s: float, samples: int) -> None:
        """Nothing to learn: the oracle is never surprised by speed."""


class OracleRisk(DropoutModel):
    """Risk 1 for a device whose next job will not deliver, 0 otherwise."""

    def __init__(self, foresight: Foresight, battery_reserve: float) -> None:
        super().__init__(RiskConfig(battery_reserve=battery_reserve))
        self._foresight = foresight

    def risks(self, devices: Sequence[str], job_seconds: np.ndarray, readings: Readings,
              hazards: np.ndarray | None = None) -> np.ndarray:
        return np.array([0.0 if self._foresight.job(device).delivers else 1.0 for device in devices])
