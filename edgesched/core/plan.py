"""One round's plan: who trains, how much, how many epochs, how late it may arrive (numpy only).

The round gets a deadline: a high quantile (90 % by default) of the candidates' predicted
times for FedAvg's local epochs (`deadline_epochs`), stretched while jobs have been missing
it. (One epoch whatever FedAvg trains gave hapt's phones updates of 1-3 epochs where FedAvg
trains 5: fast rounds that each taught the model little.) Not the K-th fastest: under label
skew, rounds made only of the fastest boards pull the model toward their data, so the
deadline leaves room for most devices, and speed decides how much each one does. Each
candidate gets the work that fills the deadline exactly at its predicted upper-quantile
speed, so everybody's predicted finish lines up (H-PS: workers finish together): fast boards
do more epochs, slow ones part of an epoch. A device too slow for even the least useful work
by the deadline may still train, for a later round: it is allowed that many rounds of
staleness, and its update is weighted down for it when it lands.

A lost job costs more than its work: the device is away for a while after it (its agent
restarting, the phone gone), and a fleet that loses many short jobs is soon half away. With
`absence_stretch` above 1 the epoch cap grows by the expected absence a job risks against the
deadline, 1 + risk x absence / deadline (at most `absence_stretch` times), so that a job carries
as much training per second of its device's time, absences included, as on a fleet that loses
none. Only the cap moves: a job still fits its deadline's window.

Selection is a multi-dimensional knapsack (the SMD paper's framing), solved greedily by
value per normalised weight: the value is a utility (data, less the dropout risk, less
staleness), the weights are a participant slot and the gateway's traffic.
A device's value grows with the rounds it sat out, so slow devices' data is never starved
for good. Selection stops once the expected deliveries (sum of 1 - risk) reach the target:
the over-selection follows the predicted risk instead of a fixed 130 %.

With `loss_utility` on it is also scaled by the device's last loss (Oort's data x loss). It is
off by default: taken best first by loss, the devices whose loss is high are chosen until it
falls, then those whose loss rose meanwhile: on label-skewed data the steps pull the model
between groups of classes (Cho et al., 2020, find loss-driven selection fast early but with a
floor of error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PlanConfig:
    target_updates: int  # updates wanted per round (K)
    batch_size: int = 32
    max_overselect: float = 2.0  # never give work to more than K x this devices
    min_epochs: float = 0.5  # the least work worth sending, as a share of a device's data
    max_epochs: int = 2
    deadline_quantile: float = 0.9
    deadline_epochs: float = 1.0  # the deadline leaves room for this many epochs (FedAvg's local epochs)
    min_deadline_s: float = 1.0
    max_deadline_s: float = 600.0
    max_staleness: int = 3
    staleness_exponent: float = 0.5  # an update s rounds late counts (1 + s) ** -exponent
    fairness_rounds: float = 5.0  # a device idle this many rounds has its value doubled
    gateway_bytes_per_s: float = math.inf  # the gateway's link: a round moves at most this x its deadline
    absence_stretch: float = 2.0  # the most the epoch cap grows for the absence a lost job costs (1: never)
    loss_utility: bool = False  # true: a device's value is its data x its last loss (Oort); false: its data alone

    def __post_init__(self) -> None:
        if self.target_updates < 1 or self.max_overselect < 1 or not 0 < self.min_epochs <= self.max_epochs \
                or self.absence_stretch < 1:
            raise ValueError("need target_updates >= 1, max_overselect >= 1, 0 < min_epochs <= max_epochs, "
                             "absence_stretch >= 1")


@dataclass(frozen=True)
class Candidates:
    """The devices that could train now, as aligned arrays (one entry per device)."""

    devices: list[str]
    samples: np.ndarray  # local training set size
    seconds_per_sample: np.ndarray  # upper-quantile prediction
    transfer_s: np.ndarray  # upper-quantile prediction
    risk: np.ndarray  # probability that the job is lost
    loss: np.ndarray  # last training loss (fleet mean when unknown)
    idle_rounds: np.ndarray  # rounds since it last trained
    energy_samples: np.ndarray  # samples its battery allows (inf on mains or charging)
    fits_memory: np.ndarray  # bool
    transfer_bytes: np.ndarray  # model down + up
    stay_s: np.ndarray  # how long it is expected to stay online (1 / its departure rate; inf: no departures)
    bits: np.ndarray  # the width its update is sent in (edgesched.core.compress; 0: float32, uncompressed)

    def take(self, index: Sequence[int]) -> Candidates:
        """The candidates at `index`, in that order."""
        idx = np.asarray(index, dtype=np.int64)
        arrays: dict[str, Any] = {f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "devices"}
        return Candidates(devices=[self.devices[i] for i in idx], **arrays)

    def epochs_s(self, epochs: float = 1.0) -> np.ndarray:
        """Predicted time for `epochs` passes over each device's data, transfers included."""
        seconds: np.ndarray = self.transfer_s + epochs * self.samples * self.seconds_per_sample
        return seconds


@dataclass(frozen=True)
class Assignment:
    device: str
    samples: int  # training samples of work (steps x batch, about)
    steps: int
    epochs: int  # passes the client may start; `steps` ends the job
    predicted_s: float  # upper-quantile time to deliver
    staleness: int  # rounds late it is expected to arrive (0: this round)
    staleness_bound: int  # rounds late it may arrive and still count
    risk: float
    utility: float
    bits: int = 0  # the width its update is sent in (0: uncompressed)


@dataclass(frozen=True)
class Plan:
    deadline_s: float
    assignments: list[Assignment]
    skipped: dict[str, str]  # device -> why it was not chosen (not listed: eligible, but enough were)
    expected_updates: float
    chosen: list[int]  # each assignment's index among the candidates
    least_late: int  # rounds late the soonest of the devices left out only as too slow lands (0: none)


def choose_deadline(cands: Candidates, cfg: PlanConfig, stretch: float = 1.0) -> float:
    """The `deadline_quantile` of eligible devices' times for `deadline_epochs` epochs, x `stretch`,
    within bounds."""
    ok = cands.fits_memory & (cands.energy_samples > 0)
    times = cands.epochs_s(cfg.deadline_epochs)[ok]
    if times.size == 0:
        return cfg.max_deadline_s
    return float(np.clip(np.quantile(times, cfg.deadline_quantile) * stretch, cfg.min_deadline_s,
                         cfg.max_deadline_s))


def plan_round(cands: Candidates, deadline: float, cfg: PlanConfig, max_staleness: int | None = None,
               steps_per_window: float | None = None, absence_s: float = 0.0, fill_s: float | None = None) -> Plan:
    """The plan for `cands` with this `deadline`. `steps_per_window`: jobs are sent as devices
    come free, not in rounds, and the server takes about this many steps per deadline's length;
    a job's staleness bound is then counted in those steps (see `_assign`). `absence_s`: how long
    a device stays away after a lost job (edgesched.core.risk), for the epoch cap's stretch.
    `fill_s`: seconds until the step these jobs wait for is predicted; a job gets
    `deadline-epochs`, and more (up to the cap) only as far as it still ends by then."""
    bound_cap = cfg.max_staleness if max_staleness is None else max_staleness
    n = cands.samples.astype(np.float64)
    sps = cands.seconds_per_sample
    least = np.maximum(cfg.min_epochs * n, np.minimum(cfg.batch_size, n))
    # Rounds late the least useful work would land (0: it fits this round's deadline).
    late = np.maximum(np.ceil((cands.transfer_s + least * sps) / deadline) - 1, 0)
    window = (late + 1) * deadline
    stretch = np.minimum(cfg.absence_stretch, 1 + cands.risk * absence_s / deadline)
    cap = cfg.max_epochs * stretch * n
    work = np.minimum((window - cands.transfer_s) / sps, cap)
    if fill_s is not None:
        work = np.minimum(work, np.maximum(cfg.deadline_epochs * n, (fill_s - cands.transfer_s) / sps))
    # A device expected to leave gets no longer a job than it is expected to stay: with departures
    # at rate h, work that ends by T is delivered with probability exp(-hT), and the work expected
    # back, (T - transfer) exp(-hT), is largest at T = transfer + 1/h.
    # Never below the least job, though: a short stay lowers the job's chance (its risk, which
    # the selection weighs) but sending nothing brings nothing back for sure.
    staying = np.maximum((cands.stay_s - cands.transfer_s) / sps, least)
    work = np.minimum(work, staying)
    energy = np.minimum(work, cands.energy_samples)

    reason = np.full(len(n), "", dtype=object)
    reason[late > bound_cap] = "too_slow"
    reason[(energy < least) & (work >= least)] = "battery"
    reason[~cands.fits_memory] = "memory"
    work = energy
    eligible = reason == ""

    loss = np.maximum(cands.loss, 1e-3) if cfg.loss_utility else 1.0
    value = n * loss * (1 - cands.risk) * (1 + late) ** -cfg.staleness_exponent
    value *= 1 + cands.idle_rounds / cfg.fairness_rounds
    slots = max(1, math.ceil(cfg.target_updates * cfg.max_overselect))
    traffic_budget = cfg.gateway_bytes_per_s * deadline
    weight = 1.0 / slots + cands.transfer_bytes / traffic_budget
    order = np.lexsort((np.array(cands.devices), -value / weight))

    chosen: list[Assignment] = []
    picked: list[int] = []
    expected = traffic = 0.0
    skipped: dict[str, str] = {}
    considered = 0
    for i in order:
        if expected >= cfg.target_updates:
            break
        considered += 1
        device = cands.devices[i]
        if not eligible[i]:
            skipped[device] = str(reason[i])
        elif len(chosen) >= slots or traffic + cands.transfer_bytes[i] > traffic_budget:
            skipped[device] = "capacity"
        else:
            chosen.append(_assign(cands, i, work[i], int(late[i]), bound_cap, float(value[i]), cfg, steps_per_window))
            picked.append(int(i))
            expected += 1 - cands.risk[i]
            traffic += cands.transfer_bytes[i]
    rest = order[considered:]  # not needed: enough were chosen; only why the ineligible ones were not is news
    skipped.update((cands.devices[i], str(reason[i])) for i in rest[~eligible[rest]])
    only_slow = late[reason == "too_slow"]
    return Plan(deadline, chosen, skipped, expected, picked, int(only_slow.min()) if only_slow.size else 0)


def _assign(cands: Candidates, i: int, work: float, late: int, bound_cap: int, value: float,
            cfg: PlanConfig, steps_per_window: float | None) -> Assignment:
    n = int(cands.samples[i])
    # Work in whole SGD steps, counted per epoch: an epoch ends with a partial batch, so a
    # 60-sample shard at batch 32 takes 2 steps an epoch, not 60 // 32 = 1.
    steps_per_epoch = max(1, math.ceil(n / cfg.batch_size))
    steps = max(1, round(work / n * steps_per_epoch))
    epochs = math.ceil(steps / steps_per_epoch)
    whole, rest = divmod(steps, steps_per_epoch)
    samples = whole * n + rest * cfg.batch_size
    predicted = float(cands.transfer_s[i] + samples * cands.seconds_per_sample[i])
    # One round of slack past the expected lateness, so a device that is merely slow still counts.
    # Sent as devices come free, a job meets about `steps_per_window` server steps per deadline
    # it runs (and a device the cap deems too slow was not chosen): it may be that many steps late.
    bound = min(late + 1, bound_cap) if steps_per_window is None \
        else math.ceil((min(late, bound_cap) + 1) * steps_per_window)
    return Assignment(cands.devices[i], samples, steps, epochs, predicted, late, bound, float(cands.risk[i]), value,
                      int(cands.bits[i]))
