"""A Flower `Grid` in virtual time: any Flower strategy runs unchanged over a virtual fleet.

Node ids are the virtual devices (index + 1). `get_node_ids()` offers the strategy the
round's candidates: `per_round` of the devices online at the current virtual time, drawn
with the run's seeded generator (Flower samples with the global `random`, which Flower's
own threads also draw from, so its choice could not repeat; offered exactly `per_round`, it
takes them all). `send_and_receive(messages, timeout)` dispatches each message to
its device's timeline (download, compute, upload, or a drop), trains the jobs that deliver
in time for real on a small pool of executor nodes of Flower's simulation engine (a message
names the partition, so any executor can train any device's data), and returns the replies
in virtual arrival order. The round ends when the last reply arrives, or at the timeout (in
virtual seconds) if any job dropped or is late. Thousands of devices therefore never need
thousands of Flower nodes, and replies come in the same order whatever the host's speed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from edgesched.clock import EventQueue
from edgesched.config import RunConfig
from edgesched.jobs import ARRAYS, CONFIG, METRICS, job_config
from edgesched.simulations.devices import Job, VirtualFleet


@dataclass(frozen=True)
class RoundOutcome:
    """What the last `send_and_receive` did, for the round's record."""

    selected: int
    delivered: int
    dropped: int
    late: int
    ended_at: float


class VirtualGrid(Grid):
    def __init__(self, grid: Grid, fleet: VirtualFleet, cfg: RunConfig, partition_sizes: list[int],
                 events: IO[str], per_round: int) -> None:
        self._grid = grid
        self._fleet = fleet
        self._cfg = cfg
        self._partition_sizes = partition_sizes
        self._events = events
        self._per_round = per_round
        self._rng = np.random.default_rng(cfg.seed)
        self._offer: list[int] | None = None  # this round's candidates, drawn once
        self._busy_until: dict[int, float] = {}  # a device still working on a late job is not offered
        self.clock = EventQueue()
        self.round = 0
        self.last: RoundOutcome | None = None
        self.last_replies: list[Message] = []
        self.device_seconds = 0.0

    def get_node_ids(self) -> Iterable[int]:
        """This round's candidates; if too few devices are online, wait for them in virtual time.

        (Flower's strategies poll this with a real one-second sleep until enough nodes are
        there, which would never end if virtual time stood still.)
        """
        if self._offer is None:
            free = self._free()
            while len(free) < self._per_round:
                later = [t for t in self._busy_until.values() if t > self.clock.now]
                self._emit(self.clock.pop_until(min([self._fleet.next_change(), *later])), idle=True)
                free = self._free()
            chosen = self._rng.choice(free, size=self._per_round, replace=False)
            self._offer = sorted(int(i) + 1 for i in chosen)
        return list(self._offer)

    def _free(self) -> list[int]:
        """Devices online now and not still busy with an earlier job."""
        now = self.clock.now
        return [i for i in self._fleet.online(now) if self._busy_until.get(i, 0.0) <= now]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = sorted(messages, key=lambda m: m.metadata.dst_node_id)  # the strategy's order is random
        if not messages:  # e.g. the strategy's evaluation round with fraction_evaluate=0
            return []
        self.round += 1
        self._offer = None
        start = self.clock.now
        deadline = start + (timeout if timeout is not None else self._cfg.round_timeout)
        self.clock.schedule(deadline, "deadline", round=self.round)
        jobs = [self._dispatch(msg, start, deadline) for msg in messages]
        for job in jobs:
            self._busy_until[job.device] = job.end if job.delivers else job.drop_at
        on_time = [(job, msg) for job, msg in zip(jobs, messages, strict=True) if job.delivers and job.end <= deadline]
        replies = self._train([msg for _, msg in on_time], [job for job, _ in on_time])
        late = sum(1 for job in jobs if job.delivers and job.end > deadline)
        dropped = sum(1 for job in jobs if not job.delivers)
        ended = deadline if (late or dropped) else max(job.end for job in jobs)
        self.clock.schedule(ended, "round_end", round=self.round, delivered=len(replies))
        self._emit(self.clock.pop_until(ended))  # late jobs' events stay queued, logged when due
        self.device_seconds += sum(job.compute_spent_s for job in jobs)
        self.last = RoundOutcome(len(jobs), len(replies), dropped, late, ended)
        self.last_replies = replies
        return replies

    def finish(self) -> None:
        """Log what is still in flight when the run ends (late uploads of the last round)."""
        self._emit(self.clock.pop_until(float("inf")))

    def _dispatch(self, msg: Message, now: float, deadline: float) -> Job:
        index = msg.metadata.dst_node_id - 1
        job = self._fleet.job(index, now, self._partition_sizes[index] * (self._cfg.local_epochs or 1))
        device = self._fleet.devices[index].device_id
        self.clock.schedule(now, "dispatch", round=self.round, device=device)
        if job.delivers:
            self.clock.schedule(now + job.download_s, "download", round=self.round, device=device)
            self.clock.schedule(now + job.download_s + job.compute_s, "compute", round=self.round, device=device)
            self.clock.schedule(job.end, "upload", round=self.round, device=device, late=job.end > deadline)
        else:
            self.clock.schedule(job.drop_at, "dropout", round=self.round, device=device)
        return job

    def _train(self, messages: list[Message], jobs: list[Job]) -> list[Message]:
        """Train the delivering jobs for real on the executor nodes; replies in arrival order."""
        if not messages:
            return []
        executors = sorted(self._grid.get_node_ids())
        real = []
        for k, (msg, job) in enumerate(zip(messages, jobs, strict=True)):
            config = job_config(self._cfg, int(msg.content[CONFIG]["server-round"]), job.device)
            content = RecordDict({ARRAYS: msg.content[ARRAYS], CONFIG: ConfigRecord(config)})
            real.append(Message(content, dst_node_id=executors[k % len(executors)],
                                message_type=msg.metadata.message_type, group_id=str(self.round)))
        by_partition = {}
        for reply in self._grid.send_and_receive(real):
            if reply.has_content():
                by_partition[int(reply.content[METRICS]["partition-id"])] = reply
        order = sorted(jobs, key=lambda j: (j.end, j.device))
        return [by_partition[j.device] for j in order if j.device in by_partition]

    def _emit(self, events: list[Any], idle: bool = False) -> None:
        """One JSON line per event, virtual time first; `idle`: too few were free until now."""
        for event in events:
            line = {"t": round(event.time, 6), "event": event.kind, **event.data}
            self._events.write(json.dumps(line) + "\n")
        if idle:
            self._events.write(json.dumps({"t": round(self.clock.now, 6), "event": "idle"}) + "\n")

    # Strategies use the methods above; run identity passes through, single messages do not.
    def set_run(self, run_id: int) -> None:
        self._grid.set_run(run_id)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self._grid.create_message(*args, **kwargs)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("the virtual grid runs whole rounds: use send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("the virtual grid runs whole rounds: use send_and_receive")
