"""Dropout risk: the probability that a job given to a device never comes back (numpy only).

Three causes, combined as independent:
- the device's own record: a Beta posterior of lost jobs, shrunk toward the fleet's pooled
  rate so a device with two jobs is not judged on two coin flips;
- churn: how often the registry saw it go offline between jobs, per online hour, shrunk toward
  the fleet's pooled rate (so one early departure after a minute online does not read as sixty
  an hour), turned into the chance of leaving within the job's predicted time (exponential);
  the planner also keeps each job within the time the device is expected to stay (`hazard`);
- its state now: a battery below its reserve and not charging, a throttled board, a link
  whose round trip is long.

It also measures what a lost job costs beyond its work: how long a device stays away after
losing one (`absence_s`; an agent that crashed restarts, a phone that left comes back later).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesched.core.readings import Readings
from edgesched.core.telemetry import Heartbeat


@dataclass(frozen=True)
class RiskConfig:
    prior_strength: float = 4.0  # jobs' worth of weight the fleet-wide rate carries per device
    prior_online_s: float = 3600.0  # online seconds' worth of weight the fleet's departure rate carries
    battery_reserve: float = 20.0  # percent below which an unplugged device is likely to stop
    slow_rtt_ms: float = 500.0
    churn: bool = True  # False: departures between jobs are not counted (an ablation)


@dataclass
class _Record:
    jobs: float = 0.0
    lost: float = 0.0
    online_s: float = 0.0
    departures: int = 0
    was_online: bool | None = None
    seen_at: float | None = None


class DropoutModel:
    def __init__(self, config: RiskConfig | None = None) -> None:
        self.config = config or RiskConfig()
        self._records: dict[str, _Record] = {}
        self._online_s = 0.0  # the fleet's, summed
        self._departures = 0
        self._jobs = self._lost = 0.0  # the fleet's, summed
        self._away_since: dict[str, float] = {}  # devices away after a lost job -> when it was lost
        self._returned_s = 0.0  # time away of those that came back, summed
        self._returns = 0

    def _get(self, device: str) -> _Record:
        """The device's record, to update (made on first use)."""
        record = self._records.get(device)
        if record is None:
            record = self._records[device] = _Record()
        return record

    def _job_counts(self, devices: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each device's jobs and lost jobs; only the devices that had jobs are read one by one."""
        jobs, lost = np.zeros(len(devices)), np.zeros(len(devices))
        get = self._records.get
        for i, device in enumerate(devices):
            record = get(device)
            if record is not None:
                jobs[i], lost[i] = record.jobs, record.lost
        return jobs, lost

    def note_presence(self, device: str, online: bool, now: float, busy: bool = False) -> None:
        """Feed the registry's view at `now`: time online between jobs and departures accumulate.

        A device busy with a job is not watched: if it leaves, that is its job's loss, counted
        by `note_job`; so each departure counts once, and churn is the leaving between jobs.
        A device seen online after a lost job is back: its time away is measured."""
        if online and self._away_since:
            lost_at = self._away_since.pop(device, None)
            if lost_at is not None:
                self._returned_s += max(0.0, now - lost_at)
                self._returns += 1
        r = self._get(device)
        if r.was_online and r.seen_at is not None:
            seconds = max(0.0, now - r.seen_at)
            r.online_s += seconds
            self._online_s += seconds
            if not online and not busy:
                r.departures += 1
                self._departures += 1
        r.was_online, r.seen_at = online, None if busy else now

    def note_job(self, device: str, lost: bool, now: float | None = None) -> None:
        """A job ended, delivered or `lost` (at `now`: from then on the device is away until seen online)."""
        if lost and now is not None:
            self._away_since.setdefault(device, now)
        r = self._get(device)
        r.jobs += 1
        r.lost += float(lost)
        self._jobs += 1
        self._lost += float(lost)

    def fleet_rate(self) -> float:
        """Pooled per-job loss rate, with a weak prior of 10 % before any job ended."""
        return (self._lost + 0.5) / (self._jobs + 5.0)

    def absence_s(self, now: float) -> float:
        """The mean time a device stays away after a lost job: all the time away so far, of the
        devices that came back and of those still away, per device that came back (at least one;
        the mean of an exponential stay from censored ones). Until the first comes back it grows
        with every second the lost devices stay away, so a fleet whose devices leave for minutes
        reads as one from its first losses, not as the few seconds they have been gone (an
        estimate that averaged over those still away would read low exactly while losses pile
        up). 0 before any job was lost."""
        if not self._away_since and not self._returns:
            return 0.0
        so_far = sum(max(0.0, now - lost_at) for lost_at in self._away_since.values())
        return (self._returned_s + so_far) / max(1, self._returns)

    def hazard(self, device: str) -> float:
        """The device's departures per online second between jobs, shrunk toward the fleet's."""
        return float(self.hazards([device])[0])

    def hazards(self, devices: Sequence[str]) -> np.ndarray:
        """`hazard` of each device: planning asks it of every registered device each round,
        most of them never seen on a large fleet (those have the fleet's rate)."""
        if not self.config.churn:
            return np.zeros(len(devices))
        # The fleet's rate itself starts from none seen in `prior_online_s`: on a gateway, boards
        # idle only seconds between jobs, and two departures in the first minute of idle time
        # must not read as a fleet whose boards stay half a minute.
        prior = self.config.prior_online_s
        fleet_hazard = self._departures / (self._online_s + prior)
        rates = np.full(len(devices), prior * fleet_hazard / prior)  # as below, of nothing seen (to the bit)
        get = self._records.get
        for i, device in enumerate(devices):
            r = get(device)
            if r is not None:
                rates[i] = (r.departures + prior * fleet_hazard) / (r.online_s + prior)
        return rates

    def risk(self, device: str, job_seconds: float, hb: Heartbeat | None) -> float:
        return float(self.risks([device], np.array([job_seconds]), Readings([hb]))[0])

    def risks(self, devices: Sequence[str], job_seconds: np.ndarray, readings: Readings,
              hazards: np.ndarray | None = None) -> np.ndarray:
        """`risk` of each device for a job of `job_seconds` (`readings`: their heartbeats';
        `hazards`: already known; a plan computes them once for every registered device)."""
        c = self.config
        jobs, lost = self._job_counts(devices)
        p_job = (lost + c.prior_strength * self.fleet_rate()) / (jobs + c.prior_strength)
        rate = self.hazards(devices) if hazards is None else hazards
        p_leave = 1.0 - np.exp(-rate * job_seconds)
        flat = (readings["battery_percent"] < c.battery_reserve) & ~(readings["charging"] > 0)  # nan: no battery
        strained = (readings["throttled"] > 0) | (readings["rtt_ms"] > c.slow_rtt_ms)
        p_state = np.maximum(np.where(flat, 0.5, 0.0), np.where(strained, 0.1, 0.0))
        risk: np.ndarray = 1.0 - (1.0 - p_job) * (1.0 - p_leave) * (1.0 - p_state)
        return risk
