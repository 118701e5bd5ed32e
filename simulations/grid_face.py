"""A Flower `Grid` on the virtual fleet, so Flower's own strategies run unchanged in virtual time.

Flower's FedAvg and FedProx are the benchmark's reference baselines: they drive their rounds
themselves (`Strategy.start`), through a Grid. This one offers them the virtual fleet:
`get_node_ids()` offers exactly `per_round` devices online and free, drawn with the run's seeded
generator, and waits for them in virtual time if too few are (Flower samples with the global
`random`, which its own threads also draw from, so its choice could not repeat; offered exactly
`per_round`, it takes them all; and its own wait is a real one-second sleep, which would never
end while virtual time stood still). `send_and_receive` puts each message on its device's
timeline and returns when the last reply arrives, or at the timeout in virtual seconds if a job
dropped or is late.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from edgesched.core.events import DeadlinePassed, Idle, RoundEnded
from edgesched.errors import EdgeschedError
from edgesched.flower.messages import ARRAYS, CONFIG
from edgesched.simulations.transport import VirtualTransport


@dataclass(frozen=True)
class RoundOutcome:
    """What the last `send_and_receive` did, for the round's record."""

    selected: int
    delivered: int
    dropped: int
    late: int
    ended_at: float
    replies: list[Message]


class FlowerGridFace(Grid):
    def __init__(self, transport: VirtualTransport, executors: Grid, per_round: int, seed: int) -> None:
        self._transport = transport
        self._clock = transport.clock
        self._executors = executors
        self._per_round = per_round
        self._rng = np.random.default_rng(seed)
        self._offer: list[int] | None = None  # this round's candidates, drawn once
        self.round = 0
        self.last: RoundOutcome | None = None

    def get_node_ids(self) -> Iterable[int]:
        """This round's candidates; if too few devices are free, wait for them in virtual time."""
        if self._offer is None:
            index = self._transport.fleet.index
            free = [index[d] for d in self._transport.reachable(self._clock.now())]
            while len(free) < self._per_round:
                until = self._transport.next_change(self._clock.now())
                if until == float("inf"):
                    raise EdgeschedError(f"only {len(free)} devices can ever be online; "
                                         f"the fleet asks for {self._per_round} per round")
                self._clock.advance(until)
                self._clock.mark(Idle())
                free = [index[d] for d in self._transport.reachable(self._clock.now())]
            chosen = self._rng.choice(free, size=self._per_round, replace=False)
            self._offer = sorted(int(i) + 1 for i in chosen)
        return list(self._offer)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = sorted(messages, key=lambda m: m.metadata.dst_node_id)  # the strategy's order is random
        if not messages:  # e.g. the strategy's evaluation round with fraction_evaluate=0
            return []
        self._offer = None
        transport, clock = self._transport, self._clock
        deadline = clock.now() + (timeout if timeout is not None else transport.cfg.round_timeout)
        self.round += 1
        clock.expect(deadline, DeadlinePassed(self.round))
        ids = []
        for msg in messages:
            config = dict(msg.content[CONFIG])
            ids.append(transport.start(msg.metadata.dst_node_id - 1, int(config["server-round"]), msg.content[ARRAYS],
                                       config, deadline))
        jobs = [transport.flights[i].job for i in ids]
        late = sum(1 for job in jobs if job.delivers and job.end > deadline)
        dropped = sum(1 for job in jobs if not job.delivers)
        ended = deadline if (late or dropped) else max(job.end for job in jobs)
        clock.advance(ended)
        replies = [reply for _, reply, _ in transport.arrivals(ids)]
        clock.mark(RoundEnded(self.round, len(replies)))
        transport.forget(ids)  # a late job's reply is never read; its events are still logged when due
        self.last = RoundOutcome(len(jobs), len(replies), dropped, late, ended, replies)
        return replies

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("Flower's strategies send whole rounds (send_and_receive)")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("Flower's strategies send whole rounds (send_and_receive)")

    # Run identity passes through to Flower's grid.
    def set_run(self, run_id: int) -> None:
        self._executors.set_run(run_id)

    @property
    def run(self) -> Any:
        return self._executors.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self._executors.create_message(*args, **kwargs)
