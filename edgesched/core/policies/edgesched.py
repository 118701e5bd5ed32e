"""The adaptive scheduler as a policy: at every look, who gets work now and whether to step now.

At each wake-up the policy makes two decisions. Whether a free device gets work now or is held
for the next round, and whether the server steps now with the updates that are in or waits for
more. How it makes them is its pace (edgesched.core.pace), chosen per block of steps by a pacer
that may learn it in the run:

- **Rounds** (devices held). A round starts once enough devices are free to expect
  `clients-per-round` updates back at the fleet's loss rate so far (as Flower waits for its
  minimum of nodes, grown by the predicted losses); after a deadline of waiting, once enough are
  free to expect `min_round_share` of those updates (with `eager_rounds`, also once every device
  online is free: nobody's job is left to end, so only devices coming back online could add to
  the round); after the round timeout, with whoever is free. A fleet smaller than those counts
  starts once all of it is free. The step is taken at the round's deadline, or as soon as every
  job due in the round has ended. Starting with part of a round matters on a fleet whose online
  devices barely cover one: waiting for more there leaves the free devices idle until a dropped
  one rejoins (minutes).
- **Streaming** (devices not held). Every free device is planned the moment it is free, up to
  `clients-per-round x max-overselect` jobs in flight, each sized to the deadline taken over the
  whole online fleet, so jobs sent at different moments still finish about as long after they
  start (equal finish, in continuous time). The server steps once `clients-per-round` updates
  are in (one per device, a device whose update waits for the step being held; with
  `stream_hold` "never" it is sent again at once, as FedBuff does, and may bring a second;
  "priced", while the fleet loses under `priced_max_loss` of its jobs, it is sent again once the
  wait for the step outweighs the absence its job risks, at most once a step, and is held as
  with "always" otherwise; never more than the devices online); at once when no job that could still count
  is out, so that no device waits for a step nobody else can bring; once two deadlines have
  passed since the last step, with `min_round_share` of them; with `early_step`, also with
  `min_round_share` of them as soon as the held devices could each do a whole job (at their
  last job's time) before the next update is predicted in, since holding them then idles more
  work than a smaller step loses; and after the round timeout with whatever is in.

Either way the scheduler (edgesched.core.scheduler) gives each chosen device its own work; jobs
that land after the step stay in flight and count in a later one while within their staleness
bound.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping

from edgesched.core.decisions import Decision, Paced, Released
from edgesched.core.engine import Job, Loss, Outcome, Wake, Weights
from edgesched.core.fleet import DeviceView
from edgesched.core.pace import ROUNDS, FixedPacer, LearnedPacer, Pace
from edgesched.core.plan import Assignment
from edgesched.core.scheduler import Scheduler
from edgesched.core.transport import Batch, FleetView, Order, Reply, Transport
from edgesched.errors import EdgeschedError

Pacer = FixedPacer | LearnedPacer
STEPS_MEASURED = 10  # streamed steps whose pace sets the staleness bounds of streamed jobs


class EdgeschedPolicy:
    def __init__(self, scheduler: Scheduler, round_timeout: float, min_round_share: float, pacer: Pacer,
                 early_step: bool = False, eager_rounds: bool = False, stream_hold: str = "priced",
                 priced_max_loss: float = 0.05, paced_staleness: bool = True) -> None:
        self.scheduler = scheduler
        self.stream_hold = stream_hold
        self.priced_max_loss = priced_max_loss
        self.early_step = early_step
        self.eager_rounds = eager_rounds
        self.paced_staleness = paced_staleness
        self.round_timeout = round_timeout
        self.min_round_share = min_round_share
        self.pacer = pacer
        self.pace: Pace = ROUNDS  # until the first step chooses
        self._step = 0
        self._began = self._give_up = self._settle = 0.0
        self._round_end: float | None = None  # rounds: set once the round is planned
        self._online = 1  # devices online at the last look
        self._planned: dict[str, tuple[Assignment, DeviceView]] = {}
        # How long the last streamed steps took (kept only with paced_staleness).
        self._streamed: deque[float] = deque(maxlen=STEPS_MEASURED)

    @property
    def log(self) -> list[Decision]:
        return self.scheduler.log

    def begin_step(self, step: int, now: float) -> None:
        self.pace, why = self.pacer.choose(step, now, self.scheduler.deadline, self.scheduler.risk.fleet_rate())
        if why is not None:
            self.scheduler.log.append(Paced(now, step, self.pace.name, why))
        self.scheduler.start_round(step)
        self._step = step
        self._began = now
        self._give_up = now + self.round_timeout
        self._settle = now + min(self.scheduler.deadline, self.round_timeout)
        self._round_end = None

    def dispatch(self, now: float, fleet: FleetView, transport: Transport, jobs: Mapping[str, Job]) -> Batch | None:
        if self.pace.hold and self._round_end is not None:
            return None
        views = fleet.views(now)
        self._online = len(views)
        busy = {job.device for job in jobs.values()}
        if now >= self._give_up and all(v.device in busy for v in views):
            busy -= self._stuck(jobs, now)
        self.scheduler.observe(views, now, busy)
        free = sum(1 for v in views if v.device not in busy)
        if self.pace.hold:
            assignments = self._round(now, views, busy, free, fleet.size())
        else:
            assignments = self._stream(now, views, busy, jobs)
        if assignments:
            by_device = {v.device: v for v in views}
            self._planned = {a.device: (a, by_device[a.device]) for a in assignments}
            return Batch([Order(a.device, epochs=a.epochs, steps=a.steps, bits=a.bits) for a in assignments])
        if now >= self._give_up and (self.pace.hold or not (jobs or self.scheduler.buffered)):
            raise EdgeschedError(f"round {self._step}: no device could take work for {self.round_timeout:.0f} s "
                                 f"({len(views)} online, {len(busy)} busy)")
        return None

    def _round(self, now: float, views: list[DeviceView], busy: set[str], free: int, size: int) -> list[Assignment]:
        """Rounds: the round's jobs, once enough devices are free (see the module docstring)."""
        if self._round_end is not None:
            return []
        wanted = self.scheduler.candidates_wanted()
        if now >= self._settle:
            wanted = math.ceil(self.min_round_share * wanted)
            if self.eager_rounds and 0 < free == len(views):  # only devices coming back could add to it
                wanted = min(wanted, free)
        wanted = min(wanted, size)  # never more than the fleet has: that wait could not end
        if free >= wanted or (free and now >= self._give_up):
            assignments = self.scheduler.plan(self._step, now, views, busy)
            if assignments:
                self._round_end = now + self.scheduler.deadline
            return assignments
        return []

    def _stream(self, now: float, views: list[DeviceView], busy: set[str], jobs: Mapping[str, Job]) -> list[Assignment]:
        """Streaming: work for the free devices now, up to the jobs in flight allowed. A device whose
        update waits for the step is held until it (`stream_hold`): a step is an average over
        devices, and a fast device sent again and again would fill it with its own data; priced,
        it is held only while the absence its job risks outweighs the wait (`Scheduler.hold_prices`),
        and only while the fleet loses few jobs: where it loses many, a device sent again mostly
        brings stale updates or none, and the hold is kept as "always" keeps it."""
        slots = self._concurrency() - len(jobs)
        if slots <= 0:
            return []
        released = {}
        if self.stream_hold == "priced" and self.scheduler.risk.fleet_rate() < self.priced_max_loss:
            prices = self.scheduler.hold_prices(views, jobs.values(), now, self._step_size())
            released = {device: price for device, price in prices.items() if not price.holds}
            held = busy | (self.scheduler.waiting - released.keys())
        else:
            held = busy if self.stream_hold == "never" else busy | self.scheduler.waiting
        if all(v.device in held for v in views):
            return []
        per_window = self._steps_per_deadline()
        assignments = self.scheduler.plan(self._step, now, views, held, slots=slots, steps_per_window=per_window)
        for a in assignments:
            if a.device in released:
                p = released[a.device]
                self.scheduler.log.append(Released(now, self._step, a.device, p.risk, p.absence_s, p.wait_s))
        return assignments

    def _steps_per_deadline(self) -> float:
        """Streaming: the server steps a job meets per deadline it runs, which its staleness bound
        is counted in. Were every job a deadline long, `max-overselect` steps (the jobs in flight
        over the updates a step takes); but a fast board's job is capped at `max-epochs` and comes
        back in a fraction of the deadline, so steps can come many times faster, and a slow
        device's job, bound to that few steps, would come back too stale to count: its work
        wasted, and its data missing from the model. So the bound is counted at the pace of the
        last streamed steps, where that is faster (`paced_staleness`)."""
        assumed = max(1.0, self._concurrency() / self._step_size())
        if not self._streamed:
            return assumed
        took = sum(self._streamed) / len(self._streamed)
        return max(assumed, self.scheduler.deadline / took) if took > 0 else assumed

    def _concurrency(self) -> int:
        plan = self.scheduler.config.plan
        return math.ceil(plan.target_updates * plan.max_overselect)

    def _step_size(self) -> int:
        """Streaming: the updates a step waits for, `clients-per-round`; never more than devices
        are online (each brings one a step)."""
        return max(1, min(self.scheduler.config.plan.target_updates, self._online))

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
        job.plan = self.scheduler.dispatched(assignment, view.heartbeat, streaming=not self.pace.hold)

    def on_reply(self, job: Job, reply: Reply, base: Weights, staleness: int, now: float) -> Outcome:
        assert reply.trained is not None and reply.metrics is not None
        m = reply.metrics
        return self.scheduler.arrived(job, now, reply.trained, base, steps=m.steps, samples=m.samples,
                                      data_size=m.num_examples, compute_s=m.seconds, loss=m.loss, moved=reply.moved)

    def on_lost(self, job: Job, now: float, loss: Loss, detail: str) -> None:
        if loss == "refused":
            self.scheduler.refuse(job, now, detail)
        else:
            self.scheduler.lost(job, now, f"error: {detail}" if loss == "error" else detail)

    def ready(self, now: float, jobs: Mapping[str, Job]) -> bool:
        if self.pace.hold:
            return self._round_end is not None and (self.scheduler.round_complete(jobs) or now >= self._round_end)
        buffered, k = self.scheduler.buffered, self._step_size()
        coming = any(not job.plan.expired for job in jobs.values())  # an update that may still count
        enough = buffered >= math.ceil(self.min_round_share * k)
        return buffered >= k or (buffered > 0 and not coming) or now >= self._give_up \
            or (enough and (now >= self._starved_at()
                            or (self.early_step and self.scheduler.idle_outweighs_wait(jobs.values(), now))))

    def _starved_at(self) -> float:
        """Streaming: when to step with fewer updates than the pace wants (the fleet cannot supply
        them now): two deadlines after the step began, with at least `min_round_share` of them."""
        return self._began + 2 * self.scheduler.deadline

    def wake(self, now: float, transport: Transport) -> Wake:
        if self.pace.hold and self._round_end is not None:
            return Wake(self._round_end)
        look = min(self._give_up, now + max(1.0, self.round_timeout / 100))
        if not self.pace.hold and self.scheduler.buffered > 0 and self._starved_at() > now:
            look = min(look, self._starved_at())
        return Wake(look)

    def close_step(self, now: float, jobs: Mapping[str, Job]) -> list[str]:
        return self.scheduler.expire(jobs.values(), now)

    def aggregate(self, model: Weights, now: float) -> tuple[Weights, int]:
        return self.scheduler.close_round(model, now)

    def after_step(self, step: int, now: float, loss: float, accuracy: float) -> None:
        if self.paced_staleness and not self.pace.hold:
            self._streamed.append(now - self._began)
        self.scheduler.after_round(step, now, loss)
        self.pacer.observe(step, now, loss, self.scheduler.risk.fleet_rate(), accuracy)
