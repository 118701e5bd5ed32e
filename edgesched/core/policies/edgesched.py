"""The adaptive scheduler as a policy: rounds planned from predictions, late updates that still count.

A round starts once enough devices are free to expect `clients-per-round` updates back at the
fleet's loss rate so far (as Flower waits for its minimum of nodes, grown by the predicted
losses); after a deadline of waiting, once enough are free to expect `min_round_share` of
those updates; after the round timeout, with whoever is free. A fleet smaller than those
counts starts once all of it is free. The scheduler (edgesched.core.scheduler) then gives each
chosen device its own work; the step is taken at the round's deadline, or as soon as every job
due in the round has ended. Jobs planned to land later stay in flight and count in a later
round while within their staleness bound.

Starting with part of a round matters on a fleet whose online devices barely cover one:
waiting for all of `clients-per-round` there leaves the free devices idle until a dropped one
rejoins (minutes), where a round of a few fewer updates costs a little noise (docs/scheduler.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from edgesched.core.decisions import Decision
from edgesched.core.engine import Job, Loss, Outcome, Wake, Weights
from edgesched.core.fleet import DeviceView
from edgesched.core.plan import Assignment
from edgesched.core.scheduler import Scheduler
from edgesched.core.transport import Batch, FleetView, Order, Reply, Transport
from edgesched.errors import EdgeschedError


class EdgeschedPolicy:
    def __init__(self, scheduler: Scheduler, round_timeout: float, min_round_share: float) -> None:
        self.scheduler = scheduler
        self.round_timeout = round_timeout
        self.min_round_share = min_round_share
        self._step = 0
        self._give_up = self._settle = 0.0
        self._round_end: float | None = None  # set once the round is planned
        self._planned: dict[str, tuple[Assignment, DeviceView]] = {}
        self._used = 0

    @property
    def log(self) -> list[Decision]:
        return self.scheduler.log

    def begin_step(self, step: int, now: float) -> None:
        self.scheduler.start_round(step)
        self._step = step
        self._give_up = now + self.round_timeout
        self._settle = now + min(self.scheduler.deadline, self.round_timeout)
        self._round_end = None

    def dispatch(self, now: float, fleet: FleetView, transport: Transport, jobs: Mapping[str, Job]) -> Batch | None:
        if self._round_end is not None:
            return None
        views = fleet.views(now)
        busy = {job.device for job in jobs.values()}
        if now >= self._give_up and all(v.device in busy for v in views):
            busy -= self._stuck(jobs, now)
        self.scheduler.observe(views, now, busy)
        free = sum(1 for v in views if v.device not in busy)
        wanted = self.scheduler.candidates_wanted()
        if now >= self._settle:
            wanted = math.ceil(self.min_round_share * wanted)
        wanted = min(wanted, fleet.size())  # never more than the fleet has: that wait could not end
        if free >= wanted or (free and now >= self._give_up):
            assignments = self.scheduler.plan(self._step, now, views, busy)
            if assignments:
                self._round_end = now + self.scheduler.deadline
                by_device = {v.device: v for v in views}
                self._planned = {a.device: (a, by_device[a.device]) for a in assignments}
                return Batch([Order(a.device, epochs=a.epochs, steps=a.steps) for a in assignments])
        if now >= self._give_up:
            raise EdgeschedError(f"round {self._step}: no device could take work for {self.round_timeout:.0f} s "
                                 f"({len(views)} online, {len(busy)} busy)")
        return None

    def _stuck(self, jobs: Mapping[str, Job], now: float) -> set[str]:
        """Devices whose one job in flight has been out longer than the round timeout, while no
        device is free: a board slowed far below its prediction, say. Each is given new work
        beside that job (which may still come and count, and is written off at a round's close
        once hopeless), so the run goes on with whoever is there; a device with two such jobs is
        given no third, and when no device is left, the run stops."""
        jobs_of = Counter(job.device for job in jobs.values())
        return {job.device for job in jobs.values()
                if jobs_of[job.device] == 1 and now - job.sent_at > self.round_timeout}

    def on_sent(self, job: Job, now: float) -> None:
        assignment, view = self._planned[job.device]
        job.plan = self.scheduler.dispatched(assignment, view.heartbeat)

    def on_reply(self, job: Job, reply: Reply, base: Weights, staleness: int, now: float) -> Outcome:
        assert reply.trained is not None and reply.metrics is not None
        m = reply.metrics
        return self.scheduler.arrived(job, now, reply.trained, base, steps=m.steps, samples=m.samples,
                                      data_size=m.num_examples, compute_s=m.seconds, loss=m.loss)

    def on_lost(self, job: Job, now: float, loss: Loss, detail: str) -> None:
        if loss == "refused":
            self.scheduler.refuse(job, now, detail)
        else:
            self.scheduler.lost(job, now, f"error: {detail}" if loss == "error" else detail)

    def ready(self, now: float, jobs: Mapping[str, Job]) -> bool:
        return self._round_end is not None and (self.scheduler.round_complete(jobs) or now >= self._round_end)

    def wake(self, now: float, transport: Transport) -> Wake:
        if self._round_end is not None:
            return Wake(self._round_end)
        return Wake(min(self._give_up, now + max(1.0, self.round_timeout / 100)))

    def close_step(self, now: float, jobs: Mapping[str, Job]) -> list[str]:
        return self.scheduler.expire(jobs.values(), now)

    def aggregate(self, model: Weights, now: float) -> tuple[Weights, int]:
        model, self._used = self.scheduler.close_round(model, now)
        return model, self._used

    def after_step(self, step: int, now: float, loss: float) -> None:
        self.scheduler.after_round(step, now, loss, self.scheduler.last_step_norm if self._used else 0.0)
