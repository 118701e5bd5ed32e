"""The adaptive scheduler: predict, plan, take in, aggregate, steer (numpy only).

One object holds what the server learns across rounds and makes every per-job decision; the
policy (edgesched.core.policies.edgesched) decides when, and the engine carries the jobs, whose
own record of the plan (`JobPlan`) rides on the engine's `Job`. Per round:

1. `plan(rnd, now, views, busy)`: predictions and dropout risks for the devices that are online
   and idle, an adaptive deadline, and the knapsack plan (edgesched.core.plan).
2. `dispatched(...)` per job sent; then `arrived(...)` or `lost(...)` as jobs end, in any
   round: an update counts while its staleness is within the bound it was given.
3. `close_round(...)`: the buffered updates become one FedNova step; late jobs stay in flight.
4. `after_round(...)`: convergence feedback on the global loss (noise told from divergence), and the
   deadline's stretch follows how many jobs made their deadline.

Every decision is appended to `self.log` as a typed record (decisions.jsonl).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from edgesched.core.aggregate import Update, apply_step, fednova, staleness_damping
from edgesched.core.agreement import Agreement, spread
from edgesched.core.compress import choose_bits, transfer_ratio
from edgesched.core.decisions import (
    Adjusted,
    Arrived,
    Decision,
    Expired,
    Lost,
    Quarantined,
    RoundPlanned,
    Screened,
    Selected,
    Skipped,
    Thinned,
)
from edgesched.core.feedback import ConvergenceMonitor, FeedbackConfig, Knobs
from edgesched.core.fleet import DeviceView
from edgesched.core.plan import Assignment, Candidates, PlanConfig, choose_deadline, plan_round
from edgesched.core.predict import Prediction, Predictions, Predictor
from edgesched.core.readings import Readings
from edgesched.core.risk import DropoutModel, RiskConfig
from edgesched.core.telemetry import Heartbeat
from edgesched.core.validate import GuardConfig, UpdateGuard, Verdict

if TYPE_CHECKING:
    from edgesched.core.engine import Job

log = logging.getLogger(__name__)
DEFAULT_DRAIN_PCT_PER_S = 0.01  # battery use under load before a device's own slope is known


@dataclass(frozen=True)
class SchedulerConfig:
    plan: PlanConfig
    server_lr: float = 1.0
    # A step on fewer updates than `plan.target_updates` is scaled by how much the fleet's
    # updates agree (edgesched.core.agreement): label-skewed fleets' one-update steps thin.
    thin_steps: bool = True
    # FedNova counts a job's work as its local steps. Its momentum-corrected count (the clients
    # use momentum 0.9) is exact for a constant gradient, but it scaled short jobs' early, large
    # gradients up by ~4x and made rounds unstable on label-skewed data (docs/scheduler.md).
    momentum: float = 0.0
    battery_reserve: float = 20.0  # percent an unplugged device keeps for its owner
    step_fill: bool = False  # streaming: a fast device trains on until its step is predicted, not idle in the hold
    # A step moves the model as far as its updates' mean staleness discount (aggregate.staleness_damping).
    staleness_damping: bool = True
    job_memory_mb: float = 256.0
    on_time_goal: float = 0.8  # share of jobs that should make their deadline
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    robust: str = "none"  # how the server step combines updates (edgesched.core.aggregate.fednova)
    # Updates in fewer bits (edgesched.core.compress): "off", "adaptive" (per job, from the
    # device's link: transfers kept within `max_transfer_share` of the job), or a fixed width.
    compression: str = "off"
    max_transfer_share: float = 0.1


@dataclass(frozen=True)
class HoldPrice:
    """Streaming: what holding a device whose update waits for the step costs against sending it."""

    risk: float  # that a job sent now is lost
    absence_s: float  # what a loss costs: how long the device then stays away
    wait_s: float | None  # what holding costs: the time until the step (None: too few jobs out to bring it)

    @property
    def holds(self) -> bool:
        return self.wait_s is not None and self.risk * self.absence_s > self.wait_s


@dataclass
class JobPlan:
    """What the scheduler keeps of a job it sent: the plan, the prediction it was sent on."""

    round: int
    assignment: Assignment
    prediction: Prediction
    factor: float  # the slowdown the prediction assumed
    expired: bool = False  # past its staleness bound: it can no longer count, the device is still busy
    window: float | None = None  # sent as devices came free: the time it had to deliver (None: in a round)


class Scheduler:
    def __init__(self, config: SchedulerConfig, predictor: Predictor, risk: DropoutModel | None = None) -> None:
        self.config = config
        self.predictor = predictor
        self.risk = risk or DropoutModel(RiskConfig(battery_reserve=config.battery_reserve))
        self.guard = UpdateGuard(config.guard)
        self.agreement = Agreement()
        p = config.plan
        self.monitor = ConvergenceMonitor(Knobs(p.max_epochs, p.max_staleness, config.server_lr), config.feedback,
                                          min_epochs=math.ceil(p.deadline_epochs))
        self.stretch = 1.0  # deadline factor: grows while jobs miss their deadline, shrinks back to 1
        self.deadline = p.min_deadline_s  # until the first plan: the shortest wait for candidates
        self.round = 0
        self.log: list[Decision] = []
        self._planned: dict[str, Prediction] = {}  # the last plan's predictions, by device
        self._online: set[str] = set()  # the devices online when the fleet was last observed
        self._buffer: list[tuple[str, str, Update]] = []  # (job id, device, update)
        self._last_round: dict[str, int] = {}
        self._loss: dict[str, float] = {}
        self._took: dict[str, float] = {}  # each device's last counted job, send to reply, in seconds
        self._due = 0  # this round's jobs planned to make the deadline, less those lost
        self._on_time = 0
        self.errors: list[float] = []  # |predicted/actual - 1| of this round's arrivals

    # -- planning ------------------------------------------------------------------------
    def observe(self, views: Sequence[DeviceView], now: float, busy: Set[str] = frozenset()) -> None:
        """What the registry shows of the fleet now: which devices are online (their departures
        between jobs, per online hour, are the churn in each one's risk; `busy`: devices with a job
        in flight) and each one's clock (a clock below the highest it reported is throttling,
        which slows its next job)."""
        online = {v.device for v in views}
        for device in sorted(self._online - online):
            self.risk.note_presence(device, False, now, device in busy)
        for v in views:
            self.risk.note_presence(v.device, True, now, v.device in busy)
            if v.heartbeat is not None:
                self.predictor.note_heartbeat(v.device, v.heartbeat)
        self._online = online

    def candidates_wanted(self) -> int:
        """Free devices a round should start with: enough that, after the fleet's loss rate so
        far, the updates wanted still come back (over-selection needs someone to select)."""
        return math.ceil(self.config.plan.target_updates / max(0.2, 1.0 - self.risk.fleet_rate()))

    def start_round(self, rnd: int) -> None:
        """A new round: from now on arrivals are measured against it."""
        self.round = rnd
        self._due = self._on_time = 0
        self.errors = []

    def plan(self, rnd: int, now: float, views: Sequence[DeviceView], busy: Set[str] = frozenset(),
             slots: int | None = None, steps_per_window: float = 1.0) -> list[Assignment]:
        """This round's jobs for the free devices among `views` (`busy`: devices with a job in flight).

        `slots`: jobs are sent as devices come free rather than in rounds; at most this many are
        planned now, and the deadline is taken over every online device, busy ones too, so that
        jobs sent at different moments are sized alike and finish about as long after they start
        (`steps_per_window`: server steps expected per deadline, for the staleness bounds)."""
        self.round = rnd
        quarantined = self.guard.held(now)
        held = [v.device for v in views if v.device in quarantined] if quarantined else []
        working = [v for v in views if v.device not in quarantined] if quarantined else list(views)
        free = [i for i, v in enumerate(working) if v.device not in busy] if busy else list(range(len(working)))
        if slots is None and len(free) < len(working):
            working = [working[i] for i in free]
            free = list(range(len(working)))
        everyone_free = len(free) == len(working)  # then the candidates are everyone, as they are
        readings = Readings([v.heartbeat for v in working])
        everyone, predictions, hazards, float32_transfer_s = self._candidates(working, readings)
        knobs = self.monitor.knobs
        # The monitor lowers max-epochs one at a time; never below the least work a job may be.
        least = math.ceil(self.config.plan.min_epochs)
        most, streaming = knobs.max_epochs, {}
        if slots is not None:
            # Equal finish gives fast devices more epochs so that they do not idle at a round's
            # barrier. Streaming has no barrier: a fast device's spare time goes to its next job,
            # on a newer model, not to epochs past FedAvg's; the deadline only trims slow devices.
            # But a device whose update is in is held until the step, a barrier of its own; with
            # `step_fill` its job fills the time until then instead (`_step_fill_s`).
            if not self.config.step_fill:
                most = min(most, math.ceil(self.config.plan.deadline_epochs))
            streaming = {"target_updates": max(1, slots), "max_overselect": 1.0}
        cfg = PlanConfig(**{**asdict(self.config.plan), "max_epochs": max(most, least),
                            "max_staleness": knobs.max_staleness, **streaming})
        # The deadline is taken on float32 transfers: a compressed job fills the window an
        # uncompressed one would, so it carries at least that job's work (the transfer it saves
        # buys local steps up to the epoch cap, no further: docs/scheduler.md), rather than the
        # deadline shrinking and more, shorter jobs going out, each risking its device's absence.
        uncompressed = dataclasses.replace(everyone, transfer_s=float32_transfer_s)
        self.deadline = choose_deadline(uncompressed, cfg, self.stretch)
        if not everyone_free:
            everyone, readings, hazards = everyone.take(free), readings.take(free), hazards[free]
        cands = everyone
        cands.risk[:] = self.risk.risks(cands.devices, cands.epochs_s(), readings, hazards)
        absence = self.risk.absence_s(now)
        fill_s = self._step_fill_s(cands) if slots is not None and self.config.step_fill else None
        per_window = None if slots is None else steps_per_window
        plan = plan_round(cands, self.deadline, cfg, steps_per_window=per_window, absence_s=absence, fill_s=fill_s)
        if not plan.assignments and not busy and plan.least_late:
            # No job is out and no device may train, some only for being too slow for the staleness
            # cap: the deadline (at most the round timeout) is short for the whole fleet, not one
            # device slow within it, and no other update would make a late one stale. The soonest
            # go, counting at their lateness, rather than the fleet idling until the run stops;
            # their jobs also correct a prediction inflated by one slow first job (a loaded
            # gateway's process start).
            plan = plan_round(cands, self.deadline, cfg, max_staleness=plan.least_late, steps_per_window=per_window,
                              absence_s=absence, fill_s=fill_s)
        self._planned.update((a.device, predictions.at(free[i])) for a, i in zip(plan.assignments, plan.chosen,
                                                                                   strict=True))
        if slots is None:
            self._due = sum(1 for a in plan.assignments if a.staleness == 0)
        self.log.append(RoundPlanned(now, rnd, self.deadline, self.stretch, len(free), len(busy),
                                     len(plan.assignments), float(plan.expected_updates), absence))
        for a in plan.assignments:
            self.log.append(Selected(now, rnd, a.device, a.samples, a.steps, a.epochs, a.predicted_s,
                                     self._planned[a.device].job_seconds(a.samples), a.staleness, a.staleness_bound,
                                     a.risk, a.utility))
        skipped = {**plan.skipped, **dict.fromkeys(held, "quarantined")}
        for device, why in skipped.items():
            self.log.append(Skipped(now, rnd, device, why))
        return plan.assignments

    def _step_fill_s(self, cands: Candidates) -> float | None:
        """When a streamed step on `cands`' jobs is predicted: once `clients-per-round` of them are
        in, taking each as `deadline-epochs` of work. A faster device trains on until then rather
        than wait in the hold for the slower ones; a job that ends after it is not made longer."""
        if not len(cands.devices):
            return None
        kth = min(len(cands.devices), self.config.plan.target_updates) - 1  # a plan may see 100,000 devices
        return float(np.partition(cands.epochs_s(self.config.plan.deadline_epochs), kth)[kth])

    def _candidates(self, views: Sequence[DeviceView], readings: Readings
                    ) -> tuple[Candidates, Predictions, np.ndarray, np.ndarray]:
        """Every device's predicted speed, transfer, loss, battery and stay as aligned arrays,
        with the predictions, each device's departure rate and its transfers were they float32
        (upper quantile; the deadline's). Column by column: a plan sees every registered
        device, 100,000 on a large fleet."""
        for v in views:
            if v.speed_test_sps:
                self.predictor.note_speed_test(v.device, v.speed_test_sps)
        known = [loss for loss in self._loss.values() if math.isfinite(loss)]
        mean_loss = float(np.mean(known)) if known else 1.0
        devices = [v.device for v in views]
        preds = self.predictor.predict_all(devices, readings, [v.board for v in views])
        samples = np.array([v.samples for v in views], dtype=np.int64)
        bits = self._bits(preds, samples)
        full_s = preds.transfer_s
        if bits.any():  # the predictor's transfers are for a float32 model each way
            preds = preds._replace(transfer_s=preds.transfer_s * transfer_ratio(bits))
        high = np.exp(self.predictor.config.quantile_z * preds.log_sd)
        sps = preds.seconds_per_sample * high
        hazards = self.risk.hazards(devices)
        with np.errstate(divide="ignore"):
            stay_s = np.where(hazards > 0, 1.0 / hazards, math.inf)
        cands = Candidates(
            devices=devices,
            samples=samples,
            seconds_per_sample=sps,
            transfer_s=preds.transfer_s * high,
            risk=np.zeros(len(views)),
            loss=np.array([self._loss.get(d, mean_loss) for d in devices], dtype=np.float64),
            idle_rounds=np.array([self.round - self._last_round.get(d, 0) for d in devices], dtype=np.float64),
            energy_samples=self._energy_samples(views, readings, sps),
            fits_memory=~(readings["mem_available_mb"] < self.config.job_memory_mb),  # nan: no heartbeat
            transfer_bytes=2.0 * self.predictor.model_bytes * transfer_ratio(bits),
            stay_s=stay_s,
            bits=bits,
        )
        return cands, preds, hazards, full_s * high

    def _bits(self, preds: Predictions, samples: np.ndarray) -> np.ndarray:
        """Each device's update width (0: uncompressed): fixed, or chosen from its predicted link
        against the compute of the run's local epochs."""
        setting = self.config.compression
        if setting == "off":
            return np.zeros(len(samples), dtype=np.int64)
        if setting != "adaptive":
            return np.full(len(samples), int(setting), dtype=np.int64)
        compute = self.config.plan.deadline_epochs * samples * preds.seconds_per_sample
        return choose_bits(preds.transfer_s, compute, self.config.max_transfer_share)

    def _energy_samples(self, views: Sequence[DeviceView], readings: Readings,
                        seconds_per_sample: np.ndarray) -> np.ndarray:
        """Samples each battery allows before it reaches the reserve (inf: mains or charging)."""
        percent = np.where(readings["charging"] > 0, math.nan, readings["battery_percent"])
        unplugged = ~np.isnan(percent)
        drain = np.array([v.battery_drain_pct_s if v.battery_drain_pct_s and v.battery_drain_pct_s > 0
                          else DEFAULT_DRAIN_PCT_PER_S for v in views], dtype=np.float64)
        spare = np.maximum(0.0, percent - self.config.battery_reserve)
        samples: np.ndarray = np.where(unplugged, spare / drain / seconds_per_sample, math.inf)
        return samples

    # -- jobs ----------------------------------------------------------------------------
    def dispatched(self, a: Assignment, hb: Heartbeat | None, streaming: bool = False) -> JobPlan:
        """A planned job was sent: what to remember of it, on the prediction it was planned with
        (`hb`: the device's heartbeat it was planned on; `streaming`: sent as it came free, not in a
        round, so it is on time if it delivers within its deadline's windows)."""
        self._last_round[a.device] = self.round
        window = (a.staleness + 1) * self.deadline if streaming else None
        return JobPlan(self.round, a, self._planned[a.device], self.predictor.slowdown(a.device, hb), window=window)

    def arrived(self, job: Job, now: float, trained: Sequence[np.ndarray], base: Sequence[np.ndarray],
                steps: int, samples: int, data_size: int, compute_s: float,
                loss: float, moved: tuple[int, int] = (0, 0)) -> Literal["counted", "ignored", "refused"]:
        """A job's trained weights came back (`base`: the global model it started from; `moved`: the
        model bytes it carried down and its reply up, for the record).

        The update is validated (edgesched.core.validate); a valid one is buffered if within its
        staleness bound ("counted"), else it is too stale ("ignored").
        """
        plan: JobPlan = job.plan
        verdict = self.guard.check(job.device, trained, base, steps, data_size, now)
        if verdict.delta is None:
            self._refused(job, now, verdict)
            return "refused"
        staleness = self.round - plan.round
        err = self.predictor.observe(job.device, plan.prediction, samples, compute_s, now - job.sent_at, plan.factor,
                                     float(transfer_ratio(np.array([plan.assignment.bits]))[0]))
        self.risk.note_job(job.device, lost=False)
        if math.isfinite(loss):
            self._loss[job.device] = loss
        ok = staleness <= plan.assignment.staleness_bound
        if ok:
            update = Update(verdict.delta, data_size, steps, staleness, plan.assignment.bits)
            self._buffer.append((job.id, job.device, update))
            self._took[job.device] = now - job.sent_at
        if plan.window is not None:  # on time: within its window, whatever steps came meanwhile
            self._due += 1
            if now - job.sent_at <= plan.window:
                self._on_time += 1
                self.errors.append(abs(err))
        elif staleness == 0 and plan.assignment.staleness == 0:
            self._on_time += 1
            self.errors.append(abs(err))
        self.log.append(Arrived(now, plan.round, job.device, "counted" if ok else "too_stale", self.round, staleness,
                                plan.assignment.staleness_bound, plan.assignment.predicted_s, now - job.sent_at, err,
                                samples, plan.assignment.bits, *moved))
        return "counted" if ok else "ignored"

    def refuse(self, job: Job, now: float, reason: str) -> None:
        """The reply was refused before its weights were read (e.g. it is oversized)."""
        self._refused(job, now, self.guard.refuse(job.device, reason, now))

    def _refused(self, job: Job, now: float, verdict: Verdict) -> None:
        """A refused reply: the job is lost, and it is a strike against its device."""
        self.lost(job, now, f"refused: {verdict.reason}")
        self._note_refusal(job.device, now, verdict)

    def _note_refusal(self, device: str, now: float, verdict: Verdict) -> None:
        if verdict.delta is not None:
            return  # clipped: it counts, at a sane size
        log.warning("refused an update from %s: %s", device, verdict.reason)
        if verdict.quarantined:
            log.warning("%s is quarantined for %.0f s: %d refused updates", device, self.guard.config.quarantine_s,
                        self.guard.config.strikes)
            self.log.append(Quarantined(now, self.round, device, now + self.guard.config.quarantine_s,
                                        str(verdict.reason)))

    def lost(self, job: Job, now: float, why: str) -> None:
        """A job that will never deliver: its device left, the transport failed, or it timed out."""
        plan: JobPlan = job.plan
        self.risk.note_job(job.device, lost=True, now=now)
        if plan.window is None and plan.round == self.round and plan.assignment.staleness == 0:
            self._due -= 1
        self.log.append(Lost(now, plan.round, job.device, why, self.round))

    def expire(self, jobs: Iterable[Job], now: float, give_up_factor: float = 5.0) -> list[str]:
        """At a round's close: mark jobs past their staleness bound, and give up on hopeless ones.

        An expired job can no longer count, but its device is still busy with it and its time
        still teaches the predictor if it comes. A job `give_up_factor` times past its
        predicted time (and a minute) is abandoned as lost; the ids returned are those.
        """
        abandoned = []
        for job in list(jobs):
            plan: JobPlan = job.plan
            waited = now - job.sent_at
            if not plan.expired and self.round - plan.round >= plan.assignment.staleness_bound:
                plan.expired = True
                self.predictor.observe_overdue(job.device, waited, plan.assignment.samples)
                self.log.append(Expired(now, plan.round, job.device, self.round))
            if plan.expired and waited > give_up_factor * plan.assignment.predicted_s + 60.0:
                self.lost(job, now, "no reply")
                abandoned.append(job.id)
        return abandoned

    @property
    def buffered(self) -> int:
        """Updates in, waiting for the next server step."""
        return len(self._buffer)

    @property
    def waiting(self) -> set[str]:
        """The devices whose update waits for the next server step."""
        return {device for _, device, _ in self._buffer}

    def idle_outweighs_wait(self, jobs: Iterable[Job], now: float) -> bool:
        """Streaming: whether the devices whose updates wait for the step (held, idle) could each
        do a whole job, at their median last job time, before the next update that may still count
        is predicted in. Holding them then costs more work than a step on fewer updates."""
        if not self._buffer:
            return False
        due = min(_dues(jobs), default=math.inf)  # none: nothing to wait for
        took = float(np.median([self._took[device] for device in self.waiting]))
        return max(now, due) - now > took

    def hold_prices(self, views: Sequence[DeviceView], jobs: Iterable[Job], now: float,
                    step_size: int) -> dict[str, HoldPrice]:
        """Streaming: for each device online whose update waits for the step, what holding it
        costs (the wait until the step: until the update that completes `step_size` is predicted
        in; none if too few jobs that could count are out, since holding then brings the step no
        sooner) against what sending it again risks: its job's risk (at its last job's time)
        times how long a device stays away after a lost job. Where a loss costs nothing (no
        losses yet, or devices come straight back) a fast device works on; where losses keep
        devices away for minutes it waits, as FedAvg's would.
        Only a device with one update waiting is priced: one with two is held whatever the
        price: a fast device with a clean record has a small risk, and would otherwise fill a
        step on a thin fleet with its own data."""
        once = {device for device, n in Counter(device for _, device, _ in self._buffer).items() if n == 1}
        waiting = [v for v in views if v.device in once]
        if not waiting:
            return {}
        due = sorted(_dues(jobs))
        need = step_size - len(self._buffer)
        wait = 0.0 if need <= 0 else max(0.0, due[need - 1] - now) if need <= len(due) else None
        devices = [v.device for v in waiting]
        risks = self.risk.risks(devices, np.array([self._took[d] for d in devices]),
                                Readings([v.heartbeat for v in waiting]))
        absence = self.risk.absence_s(now)
        return {d: HoldPrice(float(r), absence, wait) for d, r in zip(devices, risks, strict=True)}

    def round_complete(self, jobs: Mapping[str, Job]) -> bool:
        """Every job of this round has ended and every on-time update is in (the round may end early)."""
        return not any(job.plan.round == self.round and job.plan.assignment.staleness == 0 and not job.plan.expired
                       for job in jobs.values())

    # -- aggregation and feedback -----------------------------------------------------------
    def close_round(self, weights: list[np.ndarray], now: float) -> tuple[list[np.ndarray], int]:
        """Screen the buffered updates' sizes, then apply them as one FedNova step.

        Returns (new weights, updates used)."""
        buffered = sorted(self._buffer, key=lambda b: b[0])  # arrival order never matters
        self._buffer = []
        verdicts = self.guard.screen([(device, u.delta, u.steps) for _, device, u in buffered], weights, now)
        updates = []
        for (_, device, update), verdict in zip(buffered, verdicts, strict=True):
            if verdict.delta is not None:
                updates.append(dataclasses.replace(update, delta=verdict.delta))
            if verdict.reason is not None:
                outcome = "clipped" if verdict.delta is not None else "refused"
                self.log.append(Screened(now, self.round, device, outcome))
                self._note_refusal(device, now, verdict)
        if not updates:
            return weights, 0
        exponent = self.config.plan.staleness_exponent
        step, _ = fednova(updates, self.config.momentum, exponent, self.config.robust)
        lr = self.monitor.knobs.server_lr
        if self.config.staleness_damping:
            lr *= staleness_damping(updates, exponent)
        if self.config.thin_steps:
            self.agreement.observe(spread(updates, self.config.momentum, exponent))
            scale = self.agreement.scale(len(updates), self.config.plan.target_updates)
            if scale < 1.0:
                self.log.append(Thinned(now, self.round, len(updates), round(self.agreement.rho or 0.0, 4),
                                        round(scale, 4)))
                lr *= scale
        return apply_step(weights, step, lr), len(updates)

    def after_round(self, rnd: int, now: float, loss: float) -> None:
        for adj in self.monitor.observe(rnd, loss):
            self.log.append(Adjusted(now, adj.round, adj.knob, adj.old, adj.new, adj.reason))
        if self._due > 0:
            share = self._on_time / self._due
            goal = self.config.on_time_goal
            old = self.stretch
            if share < goal:
                self.stretch = min(4.0, self.stretch * 1.25)
            elif share > (1 + goal) / 2:
                self.stretch = max(1.0, self.stretch / 1.1)
            if self.stretch != old:
                self.log.append(Adjusted(now, rnd, "deadline_stretch", old, self.stretch,
                                         f"{share:.0%} of jobs made the deadline (goal {goal:.0%})"))

    def median_error(self) -> float | None:
        return float(np.median(self.errors)) if self.errors else None


def _dues(jobs: Iterable[Job]) -> list[float]:
    """When each job in flight that may still count is predicted back."""
    return [job.sent_at + job.plan.prediction.job_seconds(job.plan.assignment.samples)
            for job in jobs if not job.plan.expired]
