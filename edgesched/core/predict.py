"""Per-device job-time prediction with feedback (JCOHSS's idea), numpy only.

A job's time is `transfer + samples x seconds_per_sample x slowdown`. Both terms are learned
per device from finished jobs, in log space, as exponentially weighted means: a device's
speed drifts (heat, other work, a new link), so recent jobs count more. `slowdown` comes from
the heartbeat at dispatch: other work on the CPU and a clock below the device's own maximum
(thermal throttling) stretch compute, so observations are divided by it before learning and
predictions multiplied by it. Each device's spread of log errors gives an upper quantile,
which the planner uses: it plans on the slow side of a prediction, not its middle.

Cold start: the device's own reported training speed if its heartbeat carries one, else its
agent's start-up speed test (onnxruntime inference of the run's model, times
`TRAIN_OVER_INFER`), else the prior for its class (board name), else the fleet-wide median of
devices already learned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from edgesched.core.readings import Readings
from edgesched.core.telemetry import NET_TYPES, Heartbeat

# Training a sample (forward, backward, update) costs this many times inferring it with
# onnxruntime; measured on one x86 core: 5.8 for the fmnist CNN, 3.8 for the hapt CNN. A prior
# only: a device's first finished job replaces it.
TRAIN_OVER_INFER = 5.0
LINK_PRIOR_KBPS = {"ethernet": 10_000.0, "wifi": 2_500.0, "cellular": 600.0, "unknown": 1_000.0}


@dataclass(frozen=True)
class PredictorConfig:
    learning_rate: float = 0.3  # weight of the newest job in the running means
    quantile_z: float = 1.28  # the planner's quantile: 1.28 = 90 %
    prior_log_sd: float = 0.7  # spread of a device never observed (a factor of ~2)
    min_log_sd: float = 0.05
    # A first job far off its prior (a deployed ClientApp's ~20 s process start against a 0.3 s
    # prior) would otherwise put the spread at e^4 and the 90 % quantile at 280x the mean: every
    # device "too slow" for any deadline, never given the job that would correct it. 1.0 keeps
    # the quantile within 3.6x of the mean while the mean itself learns.
    max_log_sd: float = 1.0
    learn: bool = True  # False: class priors only; neither jobs nor reported speeds teach (an ablation)


class Predictions(NamedTuple):
    """Many devices' predictions as aligned arrays."""

    seconds_per_sample: np.ndarray
    transfer_s: np.ndarray
    log_sd: np.ndarray

    def at(self, i: int) -> Prediction:
        return Prediction(float(self.seconds_per_sample[i]), float(self.transfer_s[i]), float(self.log_sd[i]))


class Prediction(NamedTuple):
    """A device's predicted job time (a plan keeps one for each device it chose)."""

    seconds_per_sample: float  # expected compute per sample under the current slowdown
    transfer_s: float  # expected download + upload
    log_sd: float  # spread of the job-time error, in log space

    def job_seconds(self, samples: float, z: float = 0.0) -> float:
        """Job time for `samples`; `z` standard deviations up (z=1.28: the 90 % quantile)."""
        return (self.transfer_s + samples * self.seconds_per_sample) * math.exp(z * self.log_sd)


@dataclass
class _Learned:
    log_sps: float | None = None  # log seconds per sample, slowdown removed
    log_transfer: float | None = None
    err_var: float | None = None  # running mean of squared log job-time errors
    jobs: int = 0
    max_freq_mhz: float = 0.0
    tested_sps: float | None = None  # seconds per sample from the agent's speed test


_LEARNED = ("max_freq_mhz", "tested_sps", "log_sps", "log_transfer", "err_var")
_UNSEEN_ROW = (0.0, math.nan, math.nan, math.nan, math.nan)  # what is known of a device before anything is
_KBPS = np.array([LINK_PRIOR_KBPS[kind] for kind in NET_TYPES])  # by Readings' net_type index


def _slowdowns(readings: Readings, top_mhz: np.ndarray) -> np.ndarray:
    """How much slower than its best each device computes now, from its heartbeat.

    Other work takes its share of the CPU (`cpu_percent` between jobs), and a clock below the
    highest one seen (`top_mhz`: throttling) slows every step in proportion."""
    cpu, freq, throttled = readings["cpu_percent"], readings["cpu_freq_mhz"], readings["throttled"]
    factor: np.ndarray = 1.0 / (1.0 - np.minimum(cpu / 100.0, 0.9))
    clocked = (freq > 0) & (top_mhz > freq)
    factor[clocked] *= top_mhz[clocked] / freq[clocked]
    factor[~(freq > 0) & (throttled > 0)] *= 1.5  # throttled, clock unknown: a Pi's soft limit costs about a third
    return factor


class Predictor:
    def __init__(self, model_bytes: int, class_sps: dict[str, float] | None = None,
                 config: PredictorConfig | None = None) -> None:
        self.model_bytes = model_bytes
        self.class_sps = class_sps or {}  # prior seconds per sample by board name
        self.config = config or PredictorConfig()
        self._devices: dict[str, _Learned] = {}
        self._median_sps: float | None = None  # cached until the next observation

    def _get(self, device: str) -> _Learned:
        """The device's learned state, to update (made on first use)."""
        learned = self._devices.get(device)
        if learned is None:
            learned = self._devices[device] = _Learned()
        return learned

    def _learned(self, devices: Sequence[str]) -> np.ndarray:
        """The `_LEARNED` fields of each device, one row each (nan: not known). Planning reads
        every registered device each round, most of them never seen on a large fleet: only the
        seen ones are read field by field."""
        table = np.tile(np.array(_UNSEEN_ROW), (len(devices), 1))
        get = self._devices.get
        for i, device in enumerate(devices):
            learned = get(device)
            if learned is not None:
                table[i] = [math.nan if (v := getattr(learned, name)) is None else v for name in _LEARNED]
        return table

    def note_heartbeat(self, device: str, hb: Heartbeat) -> None:
        learned = self._get(device)
        if hb.cpu_freq_mhz:
            learned.max_freq_mhz = max(learned.max_freq_mhz, hb.cpu_freq_mhz)

    def note_speed_test(self, device: str, infer_samples_per_s: float) -> None:
        """The device's agent timed onnxruntime on the run's model: its first jobs' prior."""
        self._get(device).tested_sps = TRAIN_OVER_INFER / infer_samples_per_s

    def slowdown(self, device: str, hb: Heartbeat | None) -> float:
        return float(_slowdowns(Readings([hb]), self._learned([device])[:, 0])[0])

    def predict(self, device: str, hb: Heartbeat | None = None, board: str | None = None) -> Prediction:
        return self.predict_all([device], Readings([hb]), [board]).at(0)

    def predict_all(self, devices: Sequence[str], readings: Readings, boards: Sequence[str | None]) -> Predictions:
        """`predict` for many devices at once, as arrays (`readings`: their heartbeats'): a plan
        predicts every registered device, 100,000 on a large fleet, so the work per device is
        gathering its numbers."""
        c = self.config
        reported, rtt = readings["train_samples_per_s"], readings["rtt_ms"]
        top, tested, log_sps, log_transfer, err_var = self._learned(devices).T
        factor = _slowdowns(readings, top)
        # seconds per sample, from the best source each device has
        sps = np.array([self.class_sps.get(b, math.nan) if b is not None else math.nan for b in boards])
        if np.isnan(sps).any():
            sps[np.isnan(sps)] = self._fleet_median_sps()
        if c.learn:
            sps = np.where(np.isnan(tested), sps, tested)
            measured = reported > 0  # already under the device's load
            sps[measured] = 1.0 / reported[measured] / factor[measured]
        learned = ~np.isnan(log_sps)
        sps[learned] = np.exp(log_sps[learned])
        # transfer: learned, else the link's prior speed and round trip
        kbps = _KBPS[readings["net_type"].astype(np.int64)]
        transfer = 2 * (np.nan_to_num(rtt) / 1000.0 + self.model_bytes / (kbps * 1000.0))
        known = ~np.isnan(log_transfer)
        transfer[known] = np.exp(log_transfer[known])
        sd = np.sqrt(err_var)
        sd[np.isnan(sd)] = c.prior_log_sd
        return Predictions(sps * factor, transfer, np.clip(sd, c.min_log_sd, c.max_log_sd))

    def observe(self, device: str, predicted: Prediction, samples: int, compute_s: float, total_s: float,
                factor: float, transfer_ratio: float = 1.0) -> float:
        """Learn from a finished job; return its signed relative error (predicted/actual - 1).

        `factor` is the slowdown the prediction assumed; compute is divided by it so the
        learned speed is the device's own, not its neighbours' load. `transfer_ratio`: the job's
        bytes moved over a float32 model's each way; its transfer time is learned per float32
        model, so a compressed job teaches the link's speed, not its own size.
        """
        expected = predicted.job_seconds(samples)
        if not self.config.learn:
            return expected / max(total_s, 1e-6) - 1.0
        learned = self._get(device)
        lr = self.config.learning_rate
        self._median_sps = None
        if samples > 0 and compute_s > 0:
            learned.log_sps = _blend(learned.log_sps, math.log(compute_s / samples / factor), lr)
        transfer = max(total_s - compute_s, 1e-3) / transfer_ratio
        learned.log_transfer = _blend(learned.log_transfer, math.log(transfer), lr)
        err = math.log(max(total_s, 1e-6) / max(expected, 1e-6))
        learned.err_var = _blend(learned.err_var, err * err, lr)
        learned.jobs += 1
        return expected / max(total_s, 1e-6) - 1.0

    def observe_overdue(self, device: str, waited_s: float, samples: int) -> None:
        """A job still running after `waited_s`: it is at least that slow (a censored sample)."""
        learned = self._get(device)
        if learned.log_sps is None or samples <= 0 or not self.config.learn:
            return
        transfer = math.exp(learned.log_transfer) if learned.log_transfer is not None else 0.0
        floor = math.log(max(waited_s - transfer, 1e-6) / samples)
        if floor > learned.log_sps:
            learned.log_sps = _blend(learned.log_sps, floor, self.config.learning_rate)
            self._median_sps = None
            learned.err_var = max(learned.err_var or 0.0, (floor - learned.log_sps) ** 2)

    def jobs_seen(self, device: str) -> int:
        learned = self._devices.get(device)
        return 0 if learned is None else learned.jobs

    def _fleet_median_sps(self) -> float:
        if self._median_sps is None:
            known = [d.log_sps for d in self._devices.values() if d.log_sps is not None]
            if known:
                self._median_sps = float(math.exp(np.median(known)))
            else:
                self._median_sps = float(np.median(list(self.class_sps.values()))) if self.class_sps else 1e-3
        return self._median_sps


def _blend(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new
