"""The adaptive scheduler: predict, plan, collect, aggregate, steer (numpy only).

One object holds what the server learns across rounds and makes every decision; adapters
(the Flower loop in edgesched.server.semi_async, the virtual fleet) only move messages and
tell it the time. Per round:

1. `plan(rnd, now, views)`: predictions and dropout risks for the devices that are online
   and idle, an adaptive deadline, and the knapsack plan (edgesched.plan).
2. `dispatched(...)` per job sent; then `arrived(...)` or `lost(...)` as jobs end, in any
   round: an update counts while its staleness is within the bound it was given.
3. `close_round(...)`: the buffered updates become one FedNova step; late jobs stay in flight.
4. `after_round(...)`: convergence feedback on the global loss and the step's norm, and the
   deadline's stretch follows how many jobs made their deadline.

Every decision is appended to `self.log` as a plain dict (decisions.jsonl).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgesched.aggregate import Update, fednova
from edgesched.config import RunConfig
from edgesched.feedback import ConvergenceMonitor, FeedbackConfig, Knobs
from edgesched.plan import Assignment, Candidates, PlanConfig, choose_deadline, plan_round
from edgesched.predict import Prediction, Predictor
from edgesched.registry import DeviceState
from edgesched.risk import DropoutModel, RiskConfig
from edgesched.telemetry import Heartbeat
from edgesched.validate import GuardConfig, UpdateGuard, Verdict

log = logging.getLogger(__name__)
DEFAULT_DRAIN_PCT_PER_S = 0.01  # battery use under load before a device's own slope is known


@dataclass(frozen=True)
class SchedulerConfig:
    plan: PlanConfig
    server_lr: float = 1.0
    # FedNova counts a job's work as its local steps. Its momentum-corrected count (the clients
    # use momentum 0.9) is exact for a constant gradient, but it scaled short jobs' early, large
    # gradients up by ~4x and made rounds unstable on label-skewed data (docs/scheduler.md).
    momentum: float = 0.0
    battery_reserve: float = 20.0  # percent an unplugged device keeps for its owner
    job_memory_mb: float = 256.0
    on_time_goal: float = 0.8  # share of jobs that should make their deadline
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    robust: str = "none"  # how the server step combines updates (edgesched.aggregate.fednova)

    @classmethod
    def from_run(cls, cfg: RunConfig) -> SchedulerConfig:
        """The scheduler's settings from the run config's kebab-case knobs."""
        cfg = cfg.resolved()
        plan = PlanConfig(
            target_updates=cfg.clients_per_round, batch_size=cfg.batch_size, max_overselect=cfg.max_overselect,
            min_epochs=cfg.min_epochs, max_epochs=cfg.max_epochs, deadline_quantile=cfg.deadline_quantile,
            deadline_epochs=float(cfg.local_epochs or 1),
            min_deadline_s=cfg.min_deadline, max_deadline_s=cfg.round_timeout, max_staleness=cfg.max_staleness,
            staleness_exponent=cfg.staleness_exponent, fairness_rounds=cfg.fairness_rounds,
            gateway_bytes_per_s=cfg.gateway_mbps * 1e6 / 8 if cfg.gateway_mbps > 0 else math.inf,
        )
        guard = GuardConfig(norm_limit=cfg.update_norm_limit, on_large_norm=cfg.large_update)
        return cls(plan=plan, server_lr=cfg.server_lr, battery_reserve=cfg.battery_reserve, guard=guard,
                   robust=cfg.robust_aggregation)


@dataclass(frozen=True)
class DeviceView:
    """What the adapter knows of one online device when a round is planned."""

    device: str
    samples: int  # local training set size
    heartbeat: Heartbeat | None = None
    board: str | None = None
    battery_drain_pct_s: float | None = None  # from its heartbeat history; > 0 means falling
    speed_test_sps: float | None = None  # samples/s its agent inferred with the run's model (onnxruntime)


@dataclass
class _Job:
    device: str
    round: int
    assignment: Assignment
    prediction: Prediction
    factor: float
    dispatched_at: float
    expired: bool = False  # past its staleness bound: it can no longer count, the device is still busy


class Scheduler:
    def __init__(self, config: SchedulerConfig, predictor: Predictor, risk: DropoutModel | None = None) -> None:
        self.config = config
        self.predictor = predictor
        self.risk = risk or DropoutModel(RiskConfig(battery_reserve=config.battery_reserve))
        self.guard = UpdateGuard(config.guard)
        p = config.plan
        self.monitor = ConvergenceMonitor(Knobs(p.max_epochs, p.max_staleness, config.server_lr), config.feedback,
                                          min_epochs=math.ceil(p.deadline_epochs))
        self.stretch = 1.0  # deadline factor: grows while jobs miss their deadline, shrinks back to 1
        self.deadline = p.min_deadline_s  # until the first plan: the shortest wait for candidates
        self.round = 0
        self.log: list[dict[str, Any]] = []
        self._jobs: dict[str, _Job] = {}
        self._buffer: list[tuple[str, str, Update]] = []  # (job id, device, update)
        self._last_round: dict[str, int] = {}
        self._loss: dict[str, float] = {}
        self._due = 0  # this round's jobs planned to make the deadline, less those lost
        self._on_time = 0
        self.last_step_norm = 0.0
        self.errors: list[float] = []  # |predicted/actual - 1| of this round's arrivals

    # -- planning ------------------------------------------------------------------------
    def busy(self) -> set[str]:
        return {job.device for job in self._jobs.values()}

    def candidates_wanted(self) -> int:
        """Free devices a round should start with: enough that, after the fleet's loss rate so
        far, the updates wanted still come back (over-selection needs someone to select)."""
        return math.ceil(self.config.plan.target_updates / max(0.2, 1.0 - self.risk.fleet_rate()))

    def start_round(self, rnd: int) -> None:
        """A new round: from now on arrivals are measured against it."""
        self.round = rnd
        self._due = self._on_time = 0
        self.errors = []

    def plan(self, rnd: int, now: float, views: Sequence[DeviceView]) -> list[Assignment]:
        self.round = rnd
        busy = self.busy()
        held = [v.device for v in views if self.guard.quarantined(v.device, now)]
        views = [v for v in views if v.device not in busy and v.device not in held]
        cands, predictions = self._candidates(views)
        knobs = self.monitor.knobs
        # The monitor lowers max-epochs one at a time; never below the least work a job may be.
        least = math.ceil(self.config.plan.min_epochs)
        cfg = PlanConfig(**{**asdict(self.config.plan), "max_epochs": max(knobs.max_epochs, least),
                            "max_staleness": knobs.max_staleness})
        fleet_rate = self.risk.fleet_rate()
        cands.risk[:] = [self.risk.risk(v.device, t, v.heartbeat, fleet_rate)
                         for v, t in zip(views, cands.epochs_s(), strict=True)]
        self.deadline = choose_deadline(cands, cfg, self.stretch)
        plan = plan_round(cands, self.deadline, cfg)
        self._due = sum(1 for a in plan.assignments if a.staleness == 0)
        self.log.append({"t": now, "round": rnd, "kind": "round", "deadline_s": self.deadline,
                         "stretch": self.stretch, "candidates": len(views), "busy": len(busy),
                         "selected": len(plan.assignments), "expected_updates": plan.expected_updates})
        for a in plan.assignments:
            pred = predictions[a.device]
            self.log.append({"t": now, "round": rnd, "kind": "plan", "device": a.device, "selected": True,
                             "samples": a.samples, "steps": a.steps, "epochs": a.epochs,
                             "predicted_s": a.predicted_s, "predicted_mean_s": pred.job_seconds(a.samples),
                             "staleness": a.staleness, "staleness_bound": a.staleness_bound,
                             "risk": a.risk, "utility": a.utility})
        skipped = {**plan.skipped, **dict.fromkeys(held, "quarantined")}
        for device, why in skipped.items():
            if why != "enough":  # the long tail of capable devices not needed is not news
                self.log.append({"t": now, "round": rnd, "kind": "plan", "device": device, "selected": False,
                                 "reason": why})
        return plan.assignments

    def _candidates(self, views: Sequence[DeviceView]) -> tuple[Candidates, dict[str, Prediction]]:
        z = self.predictor.config.quantile_z
        for v in views:
            if v.speed_test_sps:
                self.predictor.note_speed_test(v.device, v.speed_test_sps)
        preds = {v.device: self.predictor.predict(v.device, v.heartbeat, v.board) for v in views}
        high = [math.exp(z * preds[v.device].log_sd) for v in views]
        sps = np.array([preds[v.device].seconds_per_sample for v in views]) * high
        known = [loss for loss in self._loss.values() if math.isfinite(loss)]
        mean_loss = float(np.mean(known)) if known else 1.0
        cands = Candidates(
            devices=[v.device for v in views],
            samples=np.array([v.samples for v in views], dtype=np.int64),
            seconds_per_sample=sps,
            transfer_s=np.array([preds[v.device].transfer_s for v in views]) * high,
            risk=np.zeros(len(views)),
            loss=np.array([self._loss.get(v.device, mean_loss) for v in views]),
            idle_rounds=np.array([self.round - self._last_round.get(v.device, 0) for v in views], dtype=np.float64),
            energy_samples=np.array([self._energy_samples(v, s) for v, s in zip(views, sps, strict=True)]),
            fits_memory=np.array([v.heartbeat is None or v.heartbeat.mem_available_mb >= self.config.job_memory_mb
                                  for v in views], dtype=bool),
            transfer_bytes=np.full(len(views), 2.0 * self.predictor.model_bytes),
        )
        return cands, preds

    def _energy_samples(self, view: DeviceView, seconds_per_sample: float) -> float:
        """Samples the battery allows before it reaches the reserve (inf: mains or charging)."""
        hb = view.heartbeat
        if hb is None or hb.battery_percent is None or hb.charging:
            return math.inf
        drain = view.battery_drain_pct_s if view.battery_drain_pct_s and view.battery_drain_pct_s > 0 \
            else DEFAULT_DRAIN_PCT_PER_S
        spare = max(0.0, hb.battery_percent - self.config.battery_reserve)
        return spare / drain / seconds_per_sample

    # -- jobs ----------------------------------------------------------------------------
    def dispatched(self, job_id: str, a: Assignment, now: float, hb: Heartbeat | None, board: str | None) -> None:
        pred = self.predictor.predict(a.device, hb, board)
        self._jobs[job_id] = _Job(a.device, self.round, a, pred, self.predictor.slowdown(a.device, hb), now)
        self._last_round[a.device] = self.round

    def in_flight(self) -> dict[str, str]:
        """Job id -> device of every job not yet ended."""
        return {job_id: job.device for job_id, job in self._jobs.items()}

    def arrived(self, job_id: str, now: float, trained: Sequence[np.ndarray], base: Sequence[np.ndarray],
                steps: int, samples: int, data_size: int, compute_s: float, loss: float) -> bool:
        """A job's trained weights came back (`base`: the global model it started from).

        The update is validated (edgesched.validate); a valid one is buffered if within its
        staleness bound. True if it counts.
        """
        job = self._jobs[job_id]
        verdict = self.guard.check(job.device, trained, base, steps, data_size, now)
        if verdict.delta is None:
            self._refused(job_id, now, verdict)
            return False
        del self._jobs[job_id]
        staleness = self.round - job.round
        err = self.predictor.observe(job.device, job.prediction, samples, compute_s, now - job.dispatched_at,
                                     job.factor)
        self.risk.note_job(job.device, lost=False)
        if math.isfinite(loss):
            self._loss[job.device] = loss
        ok = staleness <= job.assignment.staleness_bound
        if ok:
            self._buffer.append((job_id, job.device, Update(verdict.delta, data_size, steps, staleness)))
        if staleness == 0 and job.assignment.staleness == 0:
            self._on_time += 1
            self.errors.append(abs(err))
        self.log.append({"t": now, "round": job.round, "kind": "outcome", "device": job.device,
                         "outcome": "counted" if ok else "too_stale", "arrived_round": self.round,
                         "staleness": staleness, "staleness_bound": job.assignment.staleness_bound,
                         "predicted_s": job.assignment.predicted_s, "actual_s": now - job.dispatched_at,
                         "error": err, "samples": samples})
        return ok

    def refuse(self, job_id: str, now: float, reason: str) -> None:
        """The adapter refused a job's reply before reading its weights (e.g. it is oversized)."""
        self._refused(job_id, now, self.guard.refuse(self._jobs[job_id].device, reason, now))

    def _refused(self, job_id: str, now: float, verdict: Verdict) -> None:
        """A refused reply: the job is lost, and it is a strike against its device."""
        device = self._jobs[job_id].device
        self.lost(job_id, now, f"refused: {verdict.reason}")
        self._note_refusal(device, now, verdict)

    def _note_refusal(self, device: str, now: float, verdict: Verdict) -> None:
        if verdict.delta is not None:
            return  # clipped: it counts, at a sane size
        log.warning("refused an update from %s: %s", device, verdict.reason)
        if verdict.quarantined:
            log.warning("%s is quarantined for %.0f s: %d refused updates", device, self.guard.config.quarantine_s,
                        self.guard.config.strikes)
            self.log.append({"t": now, "round": self.round, "kind": "quarantine", "device": device,
                             "until": now + self.guard.config.quarantine_s, "reason": verdict.reason})

    def lost(self, job_id: str, now: float, why: str) -> None:
        """A job that will never deliver: its device left, the transport failed, or it timed out."""
        job = self._jobs.pop(job_id)
        self.risk.note_job(job.device, lost=True)
        if job.round == self.round and job.assignment.staleness == 0:
            self._due -= 1
        self.log.append({"t": now, "round": job.round, "kind": "outcome", "device": job.device, "outcome": "lost",
                         "reason": why, "arrived_round": self.round})

    def expire(self, now: float, give_up_factor: float = 5.0) -> list[str]:
        """At a round's close: mark jobs past their staleness bound, and give up on hopeless ones.

        An expired job can no longer count, but its device is still busy with it and its time
        still teaches the predictor if it comes. A job `give_up_factor` times past its
        predicted time (and a minute) is abandoned as lost; the ids returned are those.
        """
        abandoned = []
        for job_id, job in list(self._jobs.items()):
            waited = now - job.dispatched_at
            if not job.expired and self.round - job.round >= job.assignment.staleness_bound:
                job.expired = True
                self.predictor.observe_overdue(job.device, waited, job.assignment.samples)
                self.log.append({"t": now, "round": job.round, "kind": "outcome", "device": job.device,
                                 "outcome": "expired", "arrived_round": self.round})
            if job.expired and waited > give_up_factor * job.assignment.predicted_s + 60.0:
                self.lost(job_id, now, "no reply")
                abandoned.append(job_id)
        return abandoned

    def round_complete(self) -> bool:
        """Every job of this round has ended and every on-time update is in (the round may end early)."""
        return not any(job.round == self.round and job.assignment.staleness == 0 and not job.expired
                       for job in self._jobs.values())

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
                self.log.append({"t": now, "round": self.round, "kind": "screen", "device": device,
                                 "outcome": "clipped" if verdict.delta is not None else "refused"})
                self._note_refusal(device, now, verdict)
        if not updates:
            return weights, 0
        step, _ = fednova(updates, self.config.momentum, self.config.plan.staleness_exponent, self.config.robust)
        lr = self.monitor.knobs.server_lr
        self.last_step_norm = float(np.sqrt(sum(float(np.sum(s * s)) for s in step)))
        new = [(w.astype(np.float64) - lr * s).astype(w.dtype) for w, s in zip(weights, step, strict=True)]
        return new, len(updates)

    def after_round(self, rnd: int, now: float, loss: float, step_norm: float) -> None:
        for adj in self.monitor.observe(rnd, loss, step_norm):
            self.log.append({"t": now, "round": rnd, "kind": "adjust", **asdict(adj)})
        if self._due > 0:
            share = self._on_time / self._due
            goal = self.config.on_time_goal
            old = self.stretch
            if share < goal:
                self.stretch = min(4.0, self.stretch * 1.25)
            elif share > (1 + goal) / 2:
                self.stretch = max(1.0, self.stretch / 1.1)
            if self.stretch != old:
                self.log.append({"t": now, "round": rnd, "kind": "adjust", "knob": "deadline_stretch",
                                 "old": old, "new": self.stretch,
                                 "reason": f"{share:.0%} of jobs made the deadline (goal {goal:.0%})"})

    def median_error(self) -> float | None:
        return float(np.median(self.errors)) if self.errors else None


def battery_drain(history: Sequence[Heartbeat]) -> float | None:
    """Percent per second the battery fell over the recent unplugged heartbeats (None: unknown)."""
    points = [(hb.sent_at, hb.battery_percent) for hb in history
              if hb.battery_percent is not None and not hb.charging]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[0][1] - points[-1][1]) / (points[-1][0] - points[0][0])


def device_view(state: DeviceState, samples: int, history: Sequence[Heartbeat],
                device: str | None = None, dataset: str | None = None) -> DeviceView:
    """A registry entry as the planner sees it (`device`: the id to plan under, if not its own;
    `dataset`: the run's, whose model a speed test must have timed to count)."""
    hb = state.heartbeat
    drain = battery_drain(history) if hb is not None and hb.battery_percent is not None else None
    caps = state.capabilities
    board = caps.board if caps else None
    tested = caps.speedtest_infer_sps if caps and dataset and caps.speedtest_model == dataset else None
    return DeviceView(device or state.device_id, samples, hb, board, drain, tested)
