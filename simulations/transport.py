"""The engine's transport on a virtual fleet: every job on its device's timeline, trained for real.

A job sent to a virtual device becomes a timeline drawn from the device's model (download,
compute, upload, or a drop: edgesched.simulations.devices), logged on the virtual clock as it
plays out. A job that delivers is trained for real by an executor (`Executors`); its reply is
handed over once its virtual arrival has passed, as the device would send it: from its node,
naming the device, with its virtual compute time. A job that drops never trains and never
replies. A job whose hard deadline it would miss is not trained either: nobody reads it. A
faulty board's update may arrive corrupt (`dynamics.bad_updates`); a hostile device, a fixed
share of the fleet drawn from the seed (`dynamics.malicious`), attacks with every update it
delivers (`dynamics.attack`).

Device i is node i + 1 and trains partition i. Replies are handed over in virtual arrival order
(device index breaks ties), so the engine takes them in the same order whatever the host's speed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from edgesched.config import RunConfig
from edgesched.core.compress import ErrorFeedback, packed_nbytes
from edgesched.core.downlink import Holdings
from edgesched.core.events import Computed, Dispatched, Downloaded, DroppedOut, Uploaded
from edgesched.core.transport import Bounds, Order, Reply
from edgesched.errors import EdgeschedError
from edgesched.flower.messages import (
    ARRAYS,
    CONFIG,
    DEVICE,
    ENCODING,
    METRICS,
    Compressed,
    decode_reply,
    job_config,
    model_record,
    packed_record,
)
from edgesched.flower.nodes import wait_for_nodes
from edgesched.simulations.clock import AgentDied, VirtualClock
from edgesched.simulations.devices import Job, VirtualFleet

REAL_POLL_S = 0.02
LIES = {"lie-steps": "steps", "lie-examples": "num-examples"}  # an attack -> the figure it inflates
REAL_PUSH_ATTEMPTS = 50


@dataclass
class Flight:
    job: Job
    message: Message  # as the device got it: addressed to its node, the job's whole config
    real_id: str | None  # the executor's message id; None for a job that is never trained
    corrupt: str | None = None  # a faulty device's update ("nan" or "scale", dynamics.bad_updates) or an attack
    bits: int = 0  # its update's width (0: float32)
    moved: tuple[int, int] = (0, 0)  # model bytes down, and up if it delivers


class Executors:
    """A few nodes of Flower's simulation engine (or in-process ones) that train any device's data:
    a message names the partition, so a thousand devices never need a thousand Flower nodes."""

    def __init__(self, grid: Grid, wanted: int) -> None:
        self.grid = grid
        self.wanted = wanted
        self._nodes: list[int] = []  # found at the first job: the engine registers them as it starts
        self._sent = 0

    def push(self, msg: Message) -> str:
        """Start a job on the next executor; one that refuses it (a busy engine) hands it to the next."""
        if not self._nodes:
            self._nodes = wait_for_nodes(self.grid, self.wanted)
        for _ in range(REAL_PUSH_ATTEMPTS):
            self._sent += 1
            node = self._nodes[self._sent % len(self._nodes)]
            out = Message(RecordDict({ARRAYS: msg.content[ARRAYS], CONFIG: msg.content[CONFIG]}), dst_node_id=node,
                          message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
            pushed = list(self.grid.push_messages([out]))
            if pushed:
                return pushed[0]
            time.sleep(REAL_POLL_S)
        raise EdgeschedError(f"the simulation engine refused a job {REAL_PUSH_ATTEMPTS} times (see its log above)")

    def pull(self, real_ids: Sequence[str]) -> list[Message]:
        return list(self.grid.pull_messages(list(real_ids)))


class VirtualTransport:
    def __init__(self, fleet: VirtualFleet, cfg: RunConfig, partition_sizes: list[int], clock: VirtualClock,
                 executors: Executors, keys: list[str]) -> None:
        self.fleet = fleet
        self.cfg = cfg
        self.sizes = partition_sizes
        self.clock = clock
        self.executors = executors
        self.keys = keys
        self.flights: dict[str, Flight] = {}
        self.device_seconds = 0.0
        self.bytes_down = self.bytes_up = 0  # model transfers completed, as the devices' links carried them
        self._faults = np.random.default_rng([cfg.seed, 0xBAD])  # its own stream: other draws never shift
        hostile = round(fleet.dyn.malicious * len(fleet.devices))  # ... and the hostile devices, from theirs
        self.hostile = {int(i) for i in np.random.default_rng([cfg.seed, 0xE71]).permutation(len(fleet.devices))
                        [:hostile]}
        self._real: dict[str, Message] = {}  # executor replies pulled ahead of their virtual arrival
        self._next_id = 1
        self._arrays: tuple[int, ArrayRecord] | None = None  # (step, its model encoded once)
        self.holdings = Holdings()  # what each device holds of the model (compressed jobs)
        self._feedback: dict[int, ErrorFeedback] = {}  # what each device's updates lost to rounding

    SAVED = ("device_seconds", "bytes_down", "bytes_up", "flights", "_faults", "_real", "_next_id", "holdings",
             "_feedback")

    def snapshot(self) -> dict[str, Any]:
        """The jobs on the devices' timelines and the random stream, for a checkpoint. Real
        training still running on an executor is not waited for: a resumed run trains those
        jobs again, from the same message and seed, and gets the same weights."""
        return {name: getattr(self, name) for name in self.SAVED}

    def restore(self, saved: dict[str, Any]) -> None:
        for name in self.SAVED:
            setattr(self, name, saved[name])
        for flight in self.flights.values():  # the executors of the stopped run are gone
            if flight.real_id is not None and flight.real_id not in self._real:
                flight.real_id = self.executors.push(flight.message)

    # -- the engine's Transport ----------------------------------------------------------------
    def send(self, device: str, step: int, order: Order, model: list[np.ndarray], deadline: float | None) -> str:
        config: dict[str, Any] = {}
        if order.epochs is not None:
            config["local-epochs"] = order.epochs
        if order.steps is not None:
            config["max-steps"] = order.steps
        index = self.fleet.index[device]
        if order.bits:  # the device trains from what it rebuilds of the difference it is sent
            download = self.holdings.download(device, model)
            moved = (download.nbytes, packed_nbytes([w.shape for w in model], order.bits))
            vid = self.start(index, step, model_record(self.keys, download.rebuilt), config, deadline, moved,
                             order.bits)
            if self.flights[vid].real_id is not None:
                self.holdings.sent(vid, device, download)
            return vid
        if self._arrays is None or self._arrays[0] != step:  # a step's jobs all start from its model
            self._arrays = (step, model_record(self.keys, model))
        return self.start(index, step, self._arrays[1], config, deadline)

    def bounds(self, device: str, order: Order) -> Bounds:
        index, training = self.fleet.index[device], self.cfg.training
        return Bounds.of(order, index, self.sizes[index], training.local_epochs, training.batch_size)

    def collect(self, job_ids: Sequence[str], max_bytes: float) -> list[Reply]:
        replies = []
        for job_id, msg, flight in self.arrivals(job_ids):
            compressed = None
            if flight.bits:
                self.holdings.confirm(job_id)
                arrays = flight.message.content[ARRAYS]
                compressed = Compressed(self.keys, [arrays[k].shape for k in self.keys], flight.bits)
            replies.append(decode_reply(msg, job_id, max_bytes, compressed, flight.moved[0]))
        return replies

    def reachable(self, now: float) -> list[str]:
        """Devices up now and not still busy with an earlier job, in index order."""
        return [self.fleet.devices[i].device_id for i in self.fleet.online(now)
                if self.fleet.devices[i].busy_until <= now]

    def next_change(self, now: float) -> float:
        """The next moment a device may come online or become free."""
        busy = [d.busy_until for d in self.fleet.devices if d.busy_until > now]
        return min([self.fleet.next_change(now), *busy])

    # -- jobs ----------------------------------------------------------------------------------
    def start(self, index: int, step: int, arrays: ArrayRecord, config: dict[str, Any], deadline: float | None,
              moved: tuple[int, int] | None = None, bits: int = 0) -> str:
        """Put a job on device `index`'s timeline, carrying `moved` bytes down and up (None: the
        float32 model each way) and replying in `bits` (0: float32); start real training if
        anyone will read it."""
        now = self.clock.now()
        vid = f"v{self._next_id}"
        self._next_id += 1
        full = {**job_config(self.cfg, step, index), **config, "partition-id": index}
        msg = Message(RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(full)}), dst_node_id=index + 1,
                      message_type=MessageType.TRAIN, group_id=str(step))
        msg.metadata.__dict__["_message_id"] = vid  # as Flower's grids do on push
        moved = moved or (self.fleet.model_bytes, self.fleet.model_bytes)
        job = self.fleet.job(index, now, self._work(index, full), moved)
        self._schedule(job, int(full["server-round"]), deadline)
        self.device_seconds += job.compute_spent_s
        self.bytes_down += moved[0] if job.ends_at >= job.compute_start else 0
        self.bytes_up += moved[1] if job.delivers else 0
        flight = Flight(job, msg, None, self._corruption(index) if job.delivers else None, bits, moved)
        self.flights[vid] = flight
        if job.delivers and (deadline is None or job.end <= deadline):  # a reply nobody reads is not trained
            flight.real_id = self.executors.push(msg)
        return vid

    def arrivals(self, job_ids: Sequence[str]) -> list[tuple[str, Message, Flight]]:
        """Replies whose virtual arrival has passed, in arrival order (device index breaks ties),
        with the jobs they answer."""
        now = self.clock.now()
        due = [(f.job.end, f.job.device, i) for i in job_ids if (f := self.flights.get(i)) is not None
               and f.real_id is not None and f.job.end <= now]
        replies = []
        for _, _, vid in sorted(due):
            flight = self.flights.pop(vid)
            assert flight.real_id is not None
            replies.append((vid, self._virtual_reply(flight, self._await_real(flight.real_id)), flight))
        return replies

    def forget(self, job_ids: Sequence[str]) -> None:
        """Jobs whose replies will never be read; their timelines still play out on the clock."""
        for job_id in job_ids:
            self.flights.pop(job_id, None)
            self.holdings.drop(job_id)

    def finish(self) -> None:
        """Play out the jobs still in flight when the run ends (their uploads or drops are logged)."""
        ends = [f.job.ends_at for f in self.flights.values()]
        busy = [d.busy_until for d in self.fleet.devices]
        self.clock.advance(max([self.clock.now(), *ends, *busy]))

    def _corruption(self, index: int) -> str | None:
        """Whether a delivered update arrives corrupt, and how: a hostile device's attack, always;
        else, now and then, a faulty board's memory or build."""
        if index in self.hostile:
            return self.fleet.dyn.attack
        rate = self.fleet.dyn.bad_updates
        if rate <= 0 or self._faults.random() >= rate:
            return None
        return "nan" if self._faults.random() < 0.5 else "scale"

    def _work(self, index: int, config: dict[str, Any]) -> int:
        """Training samples a job's config asks of this device's partition."""
        n = self.sizes[index]
        full = int(config["local-epochs"]) * n
        if "max-steps" not in config:
            return full
        per_epoch = -(-n // self.cfg.training.batch_size)
        whole, rest = divmod(int(config["max-steps"]), per_epoch)
        return min(full, whole * n + rest * self.cfg.training.batch_size)

    def _await_real(self, real_id: str) -> Message:
        while real_id not in self._real:
            wanted = [f.real_id for f in self.flights.values() if f.real_id and f.real_id not in self._real]
            for reply in self.executors.pull([real_id, *wanted]):
                self._real[reply.metadata.reply_to_message_id] = reply
            if real_id not in self._real:
                time.sleep(REAL_POLL_S)
        return self._real.pop(real_id)

    def _virtual_reply(self, flight: Flight, real: Message) -> Message:
        """The executor's reply as the device sends it: from its node, naming it, with its virtual compute time."""
        if real.has_error():
            return Message(real.error, reply_to=flight.message)
        content = RecordDict(dict(real.content.items()))
        metrics = dict(real.content[METRICS])
        if flight.corrupt in LIES:
            metrics[LIES[flight.corrupt]] = 1e9
        elif flight.corrupt is not None:
            content[ARRAYS] = _corrupt(flight.message.content[ARRAYS], real.content[ARRAYS], flight.corrupt)
        if flight.bits:  # the device sends its change, in its width, less what it held back from earlier ones
            start, trained = flight.message.content[ARRAYS], content[ARRAYS]
            change = [trained[k].numpy() - start[k].numpy() for k in self.keys]
            feedback = self._feedback.setdefault(flight.job.device, ErrorFeedback())
            content[ARRAYS] = packed_record(self.keys, feedback.compress(change, flight.bits, int(metrics["steps"])))
            content[ENCODING] = ConfigRecord({"bits": flight.bits})
        job = flight.job
        metrics["seconds"] = job.compute_s
        metrics["samples-per-second"] = metrics["samples"] / job.compute_s if job.compute_s > 0 else 0.0
        content[METRICS] = MetricRecord(metrics)
        content[DEVICE] = ConfigRecord({"device-id": self.fleet.devices[job.device].device_id})
        return Message(content, reply_to=flight.message)

    def _schedule(self, job: Job, step: int, deadline: float | None) -> None:
        device = self.fleet.devices[job.device].device_id
        clock = self.clock
        clock.schedule(job.dispatched, Dispatched(step, device))
        if job.delivers:
            clock.schedule(job.compute_start, Downloaded(step, device))
            clock.schedule(job.compute_start + job.compute_s, Computed(step, device, True if job.throttled else None))
            clock.schedule(job.end, Uploaded(step, device, None if deadline is None else job.end > deadline))
        else:
            assert job.drop_at is not None and job.cause is not None
            clock.schedule(job.drop_at, AgentDied(DroppedOut(step, device, job.cause), job.device, job.session))
        clock.job_ends_at(job.ends_at)


def _corrupt(sent: ArrayRecord, trained: ArrayRecord, how: str) -> ArrayRecord:
    """A corrupt update: NaN in its first tensor, or its change to the model reversed or 100x too large."""
    out, poisoned = {}, False
    for key, array in trained.items():
        base, new = sent[key].numpy(), array.numpy()
        if how in ("scale", "sign-flip"):
            new = (base + (100 if how == "scale" else -1) * (new - base)).astype(new.dtype)
        elif not poisoned and np.issubdtype(new.dtype, np.floating):
            new, poisoned = np.full_like(new, np.nan), True
        out[key] = Array(new)
    return ArrayRecord(out)
