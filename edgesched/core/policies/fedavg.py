"""FedAvg (McMahan et al., 2017) in synchronous rounds, and FedAvg with a deadline.

Each round samples `per_round` devices, seeded, from those the transport can reach and that are
free (waiting for enough of them as Flower's FedAvg waits for its minimum of nodes), sends each
the run's local epochs on its own data, waits for every reply or the round's `timeout`, and
averages the replies' weights by their data size. Replies that miss the round are never used.

With `flower_sum` the average is taken as Flower's FedAvg takes it: in arrival order, summing
in the weights' own precision. The `deadline` baseline (production FL as Bonawitz et al., 2019
describe it: over-selection and a fixed deadline) is Flower's FedAvg with a deadline, and keeps
its arithmetic. Otherwise replies are averaged in partition order in float64, so that arrival
order never changes the model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from edgesched.core.aggregate import weighted_average
from edgesched.core.decisions import Decision
from edgesched.core.engine import Job, Loss, Outcome, Wake, Weights
from edgesched.core.transport import Batch, FleetView, Order, Reply, Transport
from edgesched.errors import EdgeschedError

log = logging.getLogger(__name__)


class FedAvg:
    def __init__(self, per_round: int, timeout: float, rng: np.random.Generator, flower_sum: bool = False) -> None:
        self.per_round = per_round
        self.timeout = timeout
        self.rng = rng
        self.log: list[Decision] = []  # a baseline keeps no decision log
        self.flower_sum = flower_sum
        self._step = 0
        self._deadline: float | None = None  # set once the round is sent
        self._sent: set[str] = set()  # this round's jobs
        self._answered: set[str] = set()  # ... that replied, with an update or an error
        self._replies: list[Reply] = []  # ... whose update is used, in arrival order
        self._free = 0

    def begin_step(self, step: int, now: float) -> None:
        self._step = step
        self._deadline = None
        self._sent, self._answered, self._replies = set(), set(), []

    def dispatch(self, now: float, fleet: FleetView, transport: Transport, jobs: Mapping[str, Job]) -> Batch | None:
        if self._deadline is not None:
            return None
        busy = {job.device for job in jobs.values()}
        free = [device for device in transport.reachable(now) if device not in busy]
        wanted = min(self.per_round, fleet.size())
        self._free = len(free)
        if len(free) < wanted:
            return None
        chosen = sorted(self.rng.choice(len(free), size=wanted, replace=False))
        self._deadline = now + self.timeout
        return Batch([Order(free[i]) for i in chosen], deadline=self._deadline)

    def on_sent(self, job: Job, now: float) -> None:
        self._sent.add(job.id)

    def on_reply(self, job: Job, reply: Reply, base: Weights, staleness: int, now: float) -> Outcome:
        if job.id not in self._sent:
            return "ignored"  # from a round that ended without it
        self._answered.add(job.id)
        self._replies.append(reply)
        return "counted"

    def on_lost(self, job: Job, now: float, loss: Loss, detail: str) -> None:
        if job.id in self._sent and loss in ("error", "refused"):
            self._answered.add(job.id)

    def ready(self, now: float, jobs: Mapping[str, Job]) -> bool:
        return self._deadline is not None and (self._answered == self._sent or now >= self._deadline)

    def wake(self, now: float, transport: Transport) -> Wake:
        if self._deadline is not None:
            return Wake(self._deadline)
        until = transport.next_change(now)
        if until == float("inf"):
            raise EdgeschedError(f"only {self._free} devices can ever be online; the fleet asks for "
                                 f"{self.per_round} per round")
        return Wake(until, idle=True)

    def close_step(self, now: float, jobs: Mapping[str, Job]) -> list[str]:
        """Jobs that did not answer by the deadline: their replies will never be used."""
        return sorted(self._sent - self._answered)

    def aggregate(self, model: Weights, now: float) -> tuple[Weights, int]:
        replies = self._replies if self.flower_sum else sorted(self._replies, key=_partition)
        if not replies:
            log.warning("round %d: no client replied in time; the model is unchanged", self._step)
            return model, 0
        trained = [r.trained for r in replies if r.trained is not None]
        sizes = [r.metrics.num_examples for r in replies if r.metrics is not None]
        return weighted_average(trained, sizes, in_model_dtype=self.flower_sum), len(replies)

    def after_step(self, step: int, now: float, loss: float, accuracy: float) -> None:
        """FedAvg has no feedback."""


def _partition(reply: Reply) -> int:
    return reply.metrics.partition if reply.metrics is not None else -1
