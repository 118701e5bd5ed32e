"""The federation engine: one loop for every strategy, over a Transport, a Clock and a FleetView.

The engine owns the run: the global model and the versions jobs in flight started from, the
jobs in flight, their replies and losses, staleness, the server step and the step records. A
`Policy` makes every decision: whom to send what and when, when to take a server step, and
how updates combine. Each server step:

1. wake-ups until the policy is ready to step; at each, in this order: take in the replies
   that came, each checked against what the gateway knows of its job before the policy sees it
   (edgesched.core.validate: a lying or broken device is refused for every strategy); drop the
   jobs whose device vanished (offline, or its agent restarted); let the policy send work; stop
   if it is ready; else wait until it wants to look again (the clock returns earlier when a
   reply may have come);
2. the policy closes the step (jobs it gives up on are written off) and aggregates: the new
   global model, and how many updates it holds;
3. the model is evaluated, the step recorded, and the callbacks (results, checkpoint) run.

With `overlap` (a gateway, on the wall clock), step 3 does not hold the devices up: the model
is evaluated in a thread while the next step begins, and the step is recorded, its loss shown
to the policy and the checkpoint written right after the next step's first jobs are out. The
policy's feedback then lags those first jobs. A virtual fleet has nothing to overlap (its
clock charges nothing for the gateway's work) and keeps the order above.

`watch`, if given, is shown the state at every wake-up and after every step (`settled`): the
run directory's fleet.json comes from it, so a run can be watched between its steps.

Numpy and stdlib only, time and randomness come in through the clock and the policy: the same
seed gives the same run on a virtual fleet, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from edgesched.core.clock import Clock
from edgesched.core.events import DeadlinePassed, Idle, RoundEnded
from edgesched.core.records import JobRecord, RoundCallback, RoundRecord, job_record, round_record
from edgesched.core.transport import Batch, Bounds, FleetView, Reply, Transport, Unsent
from edgesched.core.validate import refusal

Weights = list[np.ndarray]
Evaluate = Callable[[Weights], tuple[float, float]]  # weights -> (loss, accuracy)
OVERSIZE = 1.5  # a reply carrying more tensor bytes than this x the model is refused unread
# Why a job ended without an update: its reply was an error; it was refused; or it is gone
# (its device vanished, the transport would not take it, the run that sent it stopped).
Loss = Literal["error", "refused", "gone"]
Outcome = Literal["counted", "ignored", "refused"]  # what became of a reply's update


@dataclass
class Job:
    """A job in flight: sent at `sent_at` during step `step`, from that step's model."""

    id: str
    device: str
    step: int
    session: int | None  # the device's agent session when it was sent (0 or None: not known)
    sent_at: float
    plan: Any = None  # what the policy keeps of it
    bounds: Bounds | None = None  # what its reply may report (the transport's figures)
    bits: int = 0  # its update's width (0: float32)


@dataclass(frozen=True)
class Wake:
    """When the policy wants to look again; `idle`: the wait is for devices to become free."""

    until: float
    idle: bool = False


class Policy(Protocol):
    def begin_step(self, step: int, now: float) -> None: ...

    def dispatch(self, now: float, fleet: FleetView, transport: Transport, jobs: Mapping[str, Job]) -> Batch | None:
        """Work to send now (None: nothing yet)."""

    def on_sent(self, job: Job, now: float) -> None: ...

    def on_reply(self, job: Job, reply: Reply, base: Weights, staleness: int, now: float) -> Outcome:
        """A reply with weights and sound figures; whether its update counts."""

    def on_lost(self, job: Job, now: float, loss: Loss, detail: str) -> None: ...

    def ready(self, now: float, jobs: Mapping[str, Job]) -> bool:
        """Take the server step now?"""

    def wake(self, now: float, transport: Transport) -> Wake: ...

    def close_step(self, now: float, jobs: Mapping[str, Job]) -> list[str]:
        """Jobs given up on at the step's end (written off as failed)."""

    def aggregate(self, model: Weights, now: float) -> tuple[Weights, int]:
        """The new global model and the number of updates in it."""

    def after_step(self, step: int, now: float, loss: float, accuracy: float) -> None: ...


@dataclass
class EngineState:
    """Where a run stands after a step: what a checkpoint keeps of the engine."""

    step: int  # the last server step taken
    keys: list[str]
    model: Weights
    versions: dict[int, Weights] = field(default_factory=dict)  # step -> the model its jobs started from
    jobs: dict[str, Job] = field(default_factory=dict)  # in flight
    history: list[RoundRecord] = field(default_factory=list)

    @classmethod
    def start(cls, weights: Mapping[str, np.ndarray]) -> EngineState:
        return cls(0, list(weights), list(weights.values()))

    def weights(self) -> dict[str, np.ndarray]:
        return dict(zip(self.keys, self.model, strict=True))


@dataclass
class _Intake:
    """What one step took in."""

    selected: int = 0
    failed: int = 0
    jobs: list[JobRecord] = field(default_factory=list)


@dataclass
class _Taken:
    """A step taken and not yet scored and recorded: its model and what it took in."""

    step: int
    model: Weights
    intake: _Intake
    used: int
    seconds: float  # wall-clock seconds since the run started, when the step was taken
    virtual_seconds: float | None
    scored: Future[tuple[float, float]] | None = None  # the evaluation running meanwhile (overlap)


class Engine:
    def __init__(self, policy: Policy, transport: Transport, clock: Clock, fleet: FleetView, evaluate: Evaluate,
                 on_round: RoundCallback, elapsed: Callable[[], float],
                 checkpoint: Callable[[EngineState], None] | None = None,
                 watch: Callable[[EngineState, bool], None] | None = None, overlap: bool = False) -> None:
        """`elapsed`: wall-clock seconds since the run started (the records' `seconds`); `watch`
        and `overlap`: see the module docstring."""
        self.policy = policy
        self.transport = transport
        self.clock = clock
        self.fleet = fleet
        self.evaluate = evaluate
        self.on_round = on_round
        self.elapsed = elapsed
        self.checkpoint = checkpoint
        self.watch = watch
        self.overlap = overlap
        self._taken: _Taken | None = None

    def run(self, state: EngineState, steps: int, until: float | None = None) -> EngineState:
        """Take server steps after `state.step` up to `steps`, and none that would start at or after
        the clock's `until` (a time budget); `state` is updated as they go."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate") as pool:
            try:
                for step in range(state.step + 1, steps + 1):
                    if until is not None and self.clock.now() >= until:
                        break
                    self._step(state, step, pool)
            finally:
                self._record(state)
        return state

    def _step(self, state: EngineState, step: int, pool: ThreadPoolExecutor) -> None:
        policy, clock = self.policy, self.clock
        intake = _Intake()
        policy.begin_step(step, clock.now())
        while True:
            self._take_in(state, step, intake)
            now = clock.now()
            batch = policy.dispatch(now, self.fleet, self.transport, state.jobs)
            if batch is not None:
                self._send(state, step, batch, now, intake)
            self._record(state)  # the last step's, once this one's first jobs are out
            if self.watch is not None:
                self.watch(state, False)
            if policy.ready(clock.now(), state.jobs):
                break
            wake = policy.wake(now, self.transport)
            clock.wait(wake.until)
            if wake.idle:
                clock.mark(Idle())
        for job_id in policy.close_step(clock.now(), state.jobs):
            if state.jobs.pop(job_id, None) is not None:
                intake.failed += 1
        state.model, used = policy.aggregate(state.model, clock.now())
        clock.mark(RoundEnded(round=step, delivered=used))
        started = {job.step for job in state.jobs.values()}
        state.versions = {s: w for s, w in state.versions.items() if s in started}
        state.step = step
        self._taken = _Taken(step, state.model, intake, used, self.elapsed(), clock.now() if clock.virtual else None)
        if self.overlap:
            self._taken.scored = pool.submit(self.evaluate, state.model)
        else:
            self._record(state)

    def _record(self, state: EngineState) -> None:
        """Score the step taken last, if it is not yet, and record it: the policy is shown its
        loss, the record and the callbacks (results, checkpoint) get it."""
        taken, self._taken = self._taken, None
        if taken is None:
            return
        loss, accuracy = taken.scored.result() if taken.scored is not None else self.evaluate(taken.model)
        self.policy.after_step(taken.step, self.clock.now(), loss, accuracy)
        intake = taken.intake
        record = round_record(taken.step, loss, accuracy, intake.jobs, intake.selected, taken.used, intake.failed,
                              taken.seconds, taken.virtual_seconds)
        state.history.append(record)
        self.on_round(record, intake.jobs, dict(zip(state.keys, taken.model, strict=True)))
        if self.checkpoint is not None:
            self.checkpoint(state)
        if self.watch is not None:
            self.watch(state, True)

    def _send(self, state: EngineState, step: int, batch: Batch, now: float, intake: _Intake) -> None:
        if batch.deadline is not None:
            self.clock.expect(batch.deadline, DeadlinePassed(round=step))
        model = state.versions.setdefault(step, state.model)
        for order in batch.orders:
            intake.selected += 1
            session = self.fleet.session(order.device, now)
            try:
                job_id = self.transport.send(order.device, step, order, model, batch.deadline)
            except Unsent as exc:
                job = Job(f"unsent-{step}-{order.device}", order.device, step, session, now)
                self.policy.on_sent(job, now)
                self.policy.on_lost(job, now, "gone", str(exc))
                intake.failed += 1
                continue
            job = Job(job_id, order.device, step, session, now, bounds=self.transport.bounds(order.device, order),
                      bits=order.bits)
            state.jobs[job_id] = job
            self.policy.on_sent(job, now)

    def _take_in(self, state: EngineState, step: int, intake: _Intake) -> None:
        """Hand every reply that came to the policy, then drop the jobs whose device is gone."""
        if not state.jobs:
            return
        now = self.clock.now()
        max_bytes = OVERSIZE * sum(w.nbytes for w in state.model)
        for reply in self.transport.collect(list(state.jobs), max_bytes):
            job = state.jobs.pop(reply.job_id, None)
            if job is not None and self._take(state, step, job, reply, now, intake):
                assert reply.metrics is not None
                intake.jobs.append(job_record(step, reply.node, reply.device_claim or "", reply.metrics, job.bits,
                                              reply.moved))
        self._drop_vanished(state, intake)

    def _take(self, state: EngineState, step: int, job: Job, reply: Reply, now: float, intake: _Intake) -> bool:
        """One reply; True if its update counts."""
        policy = self.policy
        if reply.delta and reply.trained is not None:  # a compressed reply: the change, made whole again
            base = state.versions[job.step]
            reply = replace(reply, delta=False, trained=[(b + d).astype(b.dtype)
                                                         for b, d in zip(base, reply.trained, strict=True)])
        if reply.refusal is not None:
            policy.on_lost(job, now, "refused", reply.refusal)
        elif reply.trained is None:
            policy.on_lost(job, now, "error", reply.error or "no weights in the reply")
        elif reply.metrics is None:
            policy.on_lost(job, now, "refused", "bad_metrics")
        elif (why := refusal(reply.trained, state.versions[job.step], reply.metrics, job.bounds)) is not None:
            policy.on_lost(job, now, "refused", why)
        else:
            if reply.device_claim is not None:
                self.fleet.seen(reply.node, reply.device_claim)
            outcome = policy.on_reply(job, reply, state.versions[job.step], step - job.step, now)
            if outcome != "refused":
                return outcome == "counted"
        intake.failed += 1
        return False

    def _drop_vanished(self, state: EngineState, intake: _Intake) -> None:
        """Jobs whose device went offline, or restarted its agent, will never reply.

        A drop is stamped with the time after the fleet was consulted: on a gateway that takes
        calls to the SuperLink, during which a Last Will may come in, and a drop stamped before
        them could precede the death that caused it."""
        gone = [job for job in state.jobs.values() if vanished(self.fleet, job, self.clock.now())]
        now = self.clock.now()
        for job in gone:
            del state.jobs[job.id]
            self.policy.on_lost(job, now, "gone", "device offline")
            intake.failed += 1

    def write_off(self, state: EngineState, job_ids: Iterable[str], now: float, why: str) -> None:
        """Jobs that can never reply (e.g. they belonged to a stopped run): lost, and forgotten."""
        for job_id in list(job_ids):
            job = state.jobs.pop(job_id)
            self.policy.on_lost(job, now, "gone", why)
        state.versions.clear()


def vanished(fleet: FleetView, job: Job, now: float) -> bool:
    """The job's device is offline, or its agent restarted since the job was sent."""
    current = fleet.session(job.device, now)
    return current is None or bool(job.session and current != job.session)
