"""A Flower `Grid` in virtual time: Flower strategies and edgesched's loop run unchanged on it.

Node ids are the virtual devices (index + 1). A message sent to one becomes a job on that
device's timeline (download, compute, upload, or a drop), and the jobs that deliver are
trained for real on a small pool of executor nodes of Flower's simulation engine: a message
names the partition, so any executor can train any device's data, and thousands of devices
never need thousands of Flower nodes. The reply a strategy sees is the real one, reporting
the device's virtual compute time.

Two ways in, as on a real Grid:
- `send_and_receive` (Flower's strategies): the round ends when the last reply arrives, or at
  the timeout in virtual seconds if a job dropped or is late. `get_node_ids()` offers exactly
  `per_round` devices online and free, drawn with the run's seeded generator (Flower samples
  with the global `random`, which its own threads also draw from, so its choice could not
  repeat; offered exactly `per_round`, it takes them all).
- `push_messages` / `pull_messages` (edgesched's semi-asynchronous loop): training starts at
  once on the executors; a pull returns the replies whose virtual arrival has passed. `wait`
  moves the virtual clock to the next arrival or drop.

Every event (dispatch, download, compute, upload, dropout, heartbeat, deadline) is written
to events.jsonl in virtual-time order; heartbeats go through `VirtualTelemetry` to the registry.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from edgesched.clock import Event, EventQueue
from edgesched.config import RunConfig
from edgesched.errors import EdgeschedError
from edgesched.jobs import ARRAYS, CONFIG, METRICS, job_config
from edgesched.server.federation import wait_for_nodes
from edgesched.simulations.devices import Job, VirtualFleet
from edgesched.simulations.heartbeats import VirtualTelemetry

REAL_POLL_S = 0.02
REAL_PUSH_ATTEMPTS = 50


@dataclass(frozen=True)
class RoundOutcome:
    """What the last `send_and_receive` did, for the round's record."""

    selected: int
    delivered: int
    dropped: int
    late: int
    ended_at: float


@dataclass
class _Flight:
    job: Job
    message: Message
    real_id: str | None  # the executor's message id; None for a job that never delivers
    corrupt: str | None = None  # a faulty device's update: "nan" or "huge" (dynamics.bad_updates)


class VirtualGrid(Grid):
    virtual = True  # also the clock of edgesched's loop (`now`, `wait`)

    def __init__(self, grid: Grid, fleet: VirtualFleet, cfg: RunConfig, partition_sizes: list[int],
                 events: IO[str], per_round: int, telemetry: VirtualTelemetry | None = None,
                 executors: int = 1, state: dict[str, Any] | None = None) -> None:
        """`state`: a `snapshot()` to continue from (a resumed run) instead of time 0."""
        self._grid = grid
        self._fleet = fleet
        self._cfg = cfg
        self._partition_sizes = partition_sizes
        self._events = events
        self._per_round = per_round
        self._telemetry = telemetry
        self._rng = np.random.default_rng(cfg.seed)
        self._faults = np.random.default_rng([cfg.seed, 0xBAD])  # its own stream: other draws never shift
        self._offer: list[int] | None = None  # this round's candidates, drawn once
        self._flights: dict[str, _Flight] = {}
        self._real: dict[str, Message] = {}  # executor replies pulled ahead of their virtual arrival
        self._next_id = 1
        self._executors_wanted = executors
        self._executors: list[int] = []  # found at the first job: the engine registers them as it starts
        self._jobs_sent = 0
        self.clock = EventQueue()
        self.round = 0
        self.last: RoundOutcome | None = None
        self.last_replies: list[Message] = []
        self.device_seconds = 0.0
        self.bytes_down = self.bytes_up = 0  # model transfers completed, as the devices' links carried them
        if state is not None:
            self._restore(state)
        elif telemetry is not None:  # every agent announces itself at start-up
            for device in fleet.devices:
                self.clock.schedule(0.0, "heartbeat", device=device.device_id, index=device.index)
            self.advance(0.0)  # the registry knows the fleet before the first round is planned

    # -- Flower's strategies: whole rounds -------------------------------------------------
    def get_node_ids(self) -> Iterable[int]:
        """This round's candidates; if too few devices are free, wait for them in virtual time.

        (Flower's strategies poll this with a real one-second sleep until enough nodes are
        there, which would never end if virtual time stood still.)
        """
        if self._offer is None:
            free = self._free()
            while len(free) < self._per_round:
                busy = [d.busy_until for d in self._fleet.devices if d.busy_until > self.clock.now]
                until = min([self._fleet.next_change(self.clock.now), *busy])
                if until == float("inf"):
                    raise EdgeschedError(f"only {len(free)} devices can ever be online; "
                                         f"the fleet asks for {self._per_round} per round")
                self.advance(until)
                self._log(self.clock.now, "idle", {})
                free = self._free()
            chosen = self._rng.choice(free, size=self._per_round, replace=False)
            self._offer = sorted(int(i) + 1 for i in chosen)
        return list(self._offer)

    def _free(self) -> list[int]:
        """Devices online now and not still busy with an earlier job."""
        now = self.clock.now
        return [i for i in self._fleet.online(now) if self._fleet.devices[i].busy_until <= now]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = sorted(messages, key=lambda m: m.metadata.dst_node_id)  # the strategy's order is random
        if not messages:  # e.g. the strategy's evaluation round with fraction_evaluate=0
            return []
        self._offer = None
        start = self.clock.now
        deadline = start + (timeout if timeout is not None else self._cfg.round_timeout)
        self.round += 1
        self.clock.schedule(deadline, "deadline", round=self.round)
        ids = self._start(messages, deadline)
        jobs = [self._flights[i].job for i in ids]
        late = sum(1 for job in jobs if job.delivers and job.end > deadline)
        dropped = sum(1 for job in jobs if not job.delivers)
        ended = deadline if (late or dropped) else max(job.end for job in jobs)
        self.advance(ended)
        replies = self.pull_messages(ids)
        self._log(ended, "round_end", {"round": self.round, "delivered": len(replies)})
        for i in ids:  # a late job's reply is never read; its events are still logged when due
            self._flights.pop(i, None)
        self.last = RoundOutcome(len(jobs), len(replies), dropped, late, ended)
        self.last_replies = replies
        return replies

    # -- edgesched's loop: push now, pull as jobs arrive --------------------------------------
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._start(list(messages), None)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Replies whose virtual arrival has passed, in arrival order (device index breaks ties)."""
        now = self.clock.now
        due = [(f.job.end, f.job.device, i) for i in message_ids if (f := self._flights.get(i)) is not None
               and f.real_id is not None and f.job.end <= now]
        replies = []
        for _, _, vid in sorted(due):
            flight = self._flights.pop(vid)
            replies.append(self._virtual_reply(flight, self._await_real(flight.real_id)))
        return replies

    def wait(self, until: float) -> None:
        """Move virtual time to `until`, or to the next arrival or drop if that comes first."""
        ends = [f.job.ends_at for f in self._flights.values() if f.job.ends_at > self.clock.now]
        self.advance(min([until, *ends]))

    def now(self) -> float:
        return self.clock.now

    def mark(self, event: str, **data: Any) -> None:
        self._log(self.clock.now, event, data)

    def advance(self, until: float) -> None:
        """Play events up to `until`: heartbeats are sent, everything is logged."""
        while (event := self.clock.pop_next(until)) is not None:
            self._handle(event)

    def finish(self) -> None:
        """Play out the jobs still in flight when the run ends (their uploads or drops are logged)."""
        ends = [f.job.ends_at for f in self._flights.values()]
        busy = [d.busy_until for d in self._fleet.devices]
        self.advance(max([self.clock.now, *ends, *busy]))

    # -- checkpoints -------------------------------------------------------------------------
    SAVED = ("clock", "round", "device_seconds", "bytes_down", "bytes_up", "_rng", "_faults", "_offer", "_flights",
             "_real", "_next_id")

    def snapshot(self) -> dict[str, Any]:
        """Virtual time, the jobs on the devices' timelines and the random stream, to pickle.

        The fleet and telemetry are pickled beside it by the caller. Real training still
        running on an executor is not waited for: a resumed run trains those jobs again, from
        the same message and seed, and gets the same weights.
        """
        return {name: getattr(self, name) for name in self.SAVED}

    def _restore(self, state: dict[str, Any]) -> None:
        for name in self.SAVED:
            setattr(self, name, state[name])
        for flight in self._flights.values():  # the executors of the stopped run are gone
            if flight.real_id is not None and flight.real_id not in self._real:
                flight.real_id = self._push_real(flight.message, flight.job.device)

    # -- jobs --------------------------------------------------------------------------------
    def _start(self, messages: list[Message], deadline: float | None) -> list[str]:
        """Put each message on its device's timeline; start real training for those that deliver."""
        now = self.clock.now
        ids = []
        real: list[tuple[str, int]] = []
        for msg in messages:
            vid = f"v{self._next_id}"
            self._next_id += 1
            msg.metadata.__dict__["_message_id"] = vid  # as Flower's grids do on push
            index = msg.metadata.dst_node_id - 1
            cfg = msg.content[CONFIG]
            job = self._fleet.job(index, now, self._work(index, cfg))
            self._schedule(job, int(cfg["server-round"]), deadline)
            self.device_seconds += job.compute_spent_s
            self.bytes_down += self._fleet.model_bytes if job.ends_at >= job.compute_start else 0
            self.bytes_up += self._fleet.model_bytes if job.delivers else 0
            flight = _Flight(job, msg, None, self._corruption() if job.delivers else None)
            if job.delivers and (deadline is None or job.end <= deadline):  # a reply nobody reads is not trained
                real.append((vid, index))
            self._flights[vid] = flight
            ids.append(vid)
        for vid, index in real:
            self._flights[vid].real_id = self._push_real(self._flights[vid].message, index)
        return ids

    def _corruption(self) -> str | None:
        """Whether a delivered update arrives corrupt, and how: a faulty board's memory or build."""
        rate = self._fleet.dyn.bad_updates
        if rate <= 0 or self._faults.random() >= rate:
            return None
        return "nan" if self._faults.random() < 0.5 else "huge"

    def _push_real(self, msg: Message, index: int) -> str:
        """Start the job on an executor; one that refuses it (a busy engine) hands it to the next."""
        for _ in range(REAL_PUSH_ATTEMPTS):
            pushed = list(self._grid.push_messages([self._executor_message(msg, index)]))
            if pushed:
                return pushed[0]
            time.sleep(REAL_POLL_S)
        raise EdgeschedError(f"the simulation engine refused a job {REAL_PUSH_ATTEMPTS} times (see its log above)")

    def _work(self, index: int, cfg: ConfigRecord) -> int:
        """Training samples a job's config asks of this device's partition."""
        n = self._partition_sizes[index]
        epochs = int(cfg.get("local-epochs", self._cfg.local_epochs or 1))
        full = epochs * n
        if "max-steps" not in cfg:
            return full
        per_epoch = -(-n // self._cfg.batch_size)
        whole, rest = divmod(int(cfg["max-steps"]), per_epoch)
        return min(full, whole * n + rest * self._cfg.batch_size)

    def _executor_message(self, msg: Message, index: int) -> Message:
        cfg = msg.content[CONFIG]
        config = {**job_config(self._cfg, int(cfg["server-round"]), index), **dict(cfg), "partition-id": index}
        content = RecordDict({ARRAYS: msg.content[ARRAYS], CONFIG: ConfigRecord(config)})
        if not self._executors:
            self._executors = wait_for_nodes(self._grid, self._executors_wanted)
        self._jobs_sent += 1
        executor = self._executors[self._jobs_sent % len(self._executors)]
        return Message(content, dst_node_id=executor, message_type=msg.metadata.message_type,
                       group_id=msg.metadata.group_id)

    def _await_real(self, real_id: str) -> Message:
        while real_id not in self._real:
            wanted = [f.real_id for f in self._flights.values() if f.real_id and f.real_id not in self._real]
            for reply in self._grid.pull_messages([real_id, *wanted]):
                self._real[reply.metadata.reply_to_message_id] = reply
            if real_id not in self._real:
                time.sleep(REAL_POLL_S)
        return self._real.pop(real_id)

    def _virtual_reply(self, flight: _Flight, real: Message) -> Message:
        """The executor's reply as the device sends it: from its node, with its virtual compute time."""
        if real.has_error():
            return Message(real.error, reply_to=flight.message)
        content = RecordDict(dict(real.content.items()))
        if flight.corrupt is not None:
            content[ARRAYS] = _corrupt(flight.message.content[ARRAYS], real.content[ARRAYS], flight.corrupt)
        metrics = dict(real.content[METRICS])
        job = flight.job
        metrics["seconds"] = job.compute_s
        metrics["samples-per-second"] = metrics["samples"] / job.compute_s if job.compute_s > 0 else 0.0
        content[METRICS] = MetricRecord(metrics)
        return Message(content, reply_to=flight.message)

    def _schedule(self, job: Job, rnd: int, deadline: float | None) -> None:
        device = self._fleet.devices[job.device].device_id
        self.clock.schedule(job.dispatched, "dispatch", round=rnd, device=device)
        if job.delivers:
            self.clock.schedule(job.compute_start, "download", round=rnd, device=device)
            compute = {"throttled": True} if job.throttled else {}
            self.clock.schedule(job.compute_start + job.compute_s, "compute", round=rnd, device=device, **compute)
            late = {"late": job.end > deadline} if deadline is not None else {}
            self.clock.schedule(job.end, "upload", round=rnd, device=device, **late)
        else:
            self.clock.schedule(job.drop_at, "dropout", round=rnd, device=device, cause=job.cause,
                                session=job.session)

    def _handle(self, event: Event) -> None:
        if event.kind == "heartbeat":
            self.clock.schedule(self._next_beat(event.time, event.data["index"]), "heartbeat", **event.data)
            device = self._fleet.devices[event.data["index"]]
            if self._telemetry.heartbeat(device, event.time):  # a device that is down sends nothing
                self._log(event.time, "heartbeat", {"device": event.data["device"]})
            return
        data = dict(event.data)
        if event.kind == "rejoin":  # an agent restarted after a dropout announces itself at once
            self._telemetry.heartbeat(self._fleet.devices[event.data["index"]], event.time)
            data.pop("index")
        if event.kind == "dropout":
            session = data.pop("session")
            if self._telemetry is not None:
                index = self._fleet.index[data["device"]]
                self._telemetry.last_will(self._fleet.devices[index], event.time, session)
                self.clock.schedule(self._fleet.devices[index].down_until, "rejoin", device=data["device"],
                                    index=index)
        self._log(event.time, event.kind, data)

    def _next_beat(self, t: float, index: int) -> float:
        """Devices beat at their own phase of the interval, so heartbeats spread out over time."""
        interval = self._fleet.dyn.heartbeat_s
        phase = interval * index / len(self._fleet.devices)
        return phase + (math.floor((t - phase) / interval + 1e-9) + 1) * interval  # strictly after t

    def _log(self, t: float, kind: str, data: dict[str, Any]) -> None:
        """One JSON line per event, virtual time first."""
        self._events.write(json.dumps({"t": round(t, 6), "event": kind, **data}) + "\n")

    # Run identity passes through to Flower's grid.
    def set_run(self, run_id: int) -> None:
        self._grid.set_run(run_id)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self._grid.create_message(*args, **kwargs)


def _corrupt(sent: ArrayRecord, trained: ArrayRecord, how: str) -> ArrayRecord:
    """A corrupt update: NaN in its first tensor, or its change to the model 100x too large."""
    out, poisoned = {}, False
    for key, array in trained.items():
        base, new = sent[key].numpy(), array.numpy()
        if how == "huge":
            new = (base + 100 * (new - base)).astype(new.dtype)
        elif not poisoned and np.issubdtype(new.dtype, np.floating):
            new, poisoned = np.full_like(new, np.nan), True
        out[key] = Array(new)
    return ArrayRecord(out)
