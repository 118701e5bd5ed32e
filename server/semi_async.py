"""The adaptive scheduler's round loop over Flower's Grid: push, then pull as jobs end.

Flower's `Strategy.start` sends a round and waits for all of it, so nothing can arrive late
and still count. This loop pushes each round's jobs with `Grid.push_messages`, pulls replies
with `Grid.pull_messages` until the round's deadline (or until every job due this round has
ended), and leaves late jobs in flight: their updates count in a later round while within
their staleness bound. It is the same loop on a gateway (Flower's Grid, the wall clock, the
MQTT registry) and in the simulator (the virtual grid and clock, the virtual registry): the
two differ only in the `Clock` and `FleetView` they pass in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from edgesched.config import RunConfig
from edgesched.errors import EdgeschedError
from edgesched.jobs import ARRAYS, CONFIG, DEVICE, METRICS, job_config
from edgesched.results import JobRecord, RoundCallback, RoundRecord
from edgesched.scheduler import DeviceView, Scheduler
from edgesched.server.federation import FederationResult, job_record, mean_train_loss

Evaluate = Callable[[list[np.ndarray]], tuple[float, float]]  # weights -> (loss, accuracy)
OVERSIZE = 1.5  # a reply carrying more tensor bytes than this x the model is refused unread


class Clock(Protocol):
    virtual: bool  # True: simulated seconds, recorded as the rounds' virtual time

    def now(self) -> float: ...

    def wait(self, until: float) -> None:
        """Return at `until`, or earlier if a reply may have arrived."""

    def mark(self, event: str, **data: object) -> None:
        """Note a moment of the run (the simulator logs it to events.jsonl)."""


class FleetView(Protocol):
    def views(self, now: float) -> list[DeviceView]:
        """The devices online now, as the registry sees them."""

    def target(self, device: str) -> tuple[int, int]:
        """(Flower node id, partition id) that trains for `device`."""

    def session(self, device: str, now: float) -> int | None:
        """The device's current agent session, or None if it is offline."""

    def seen(self, node: int, device_id: str) -> None:
        """A reply from `node` named the device it runs on."""

    def size(self) -> int:
        """Devices in the fleet, online or not."""


class WallClock:
    """Deployment time: Unix seconds (the registry's clock), polling every `poll_s`."""

    virtual = False

    def __init__(self, poll_s: float = 0.2) -> None:
        self.poll_s = poll_s

    def now(self) -> float:
        return time.time()

    def wait(self, until: float) -> None:
        time.sleep(max(0.0, min(self.poll_s, until - time.time())))

    def mark(self, event: str, **data: object) -> None:
        """The gateway's log has the rounds already."""


@dataclass
class _Intake:
    """What a round took in: the job records of updates that counted, and the jobs lost."""

    jobs: list[JobRecord] = field(default_factory=list)
    lost: int = 0


@dataclass(frozen=True)
class _Sent:
    job_id: str
    device: str
    round: int
    session: int | None


@dataclass
class LoopState:
    """Where the loop stands after a round's aggregation: what a checkpoint must keep of it."""

    round: int  # the last round aggregated
    keys: list[str]
    weights: list[np.ndarray]  # the global model
    bases: dict[int, list[np.ndarray]]  # the global model each round with jobs in flight started from
    pending: dict[str, _Sent]  # jobs in flight
    history: list[RoundRecord]


SaveState = Callable[[LoopState, Scheduler], None]  # called after each round: a checkpoint


def run_semi_async(grid: Grid, clock: Clock, fleet: FleetView, scheduler: Scheduler, cfg: RunConfig,
                   weights: dict[str, np.ndarray], evaluate: Evaluate,
                   on_round: RoundCallback,
                   resume: LoopState | None = None, checkpoint: SaveState | None = None) -> FederationResult:
    """Run rounds until `cfg.rounds`, from `resume` if given; `checkpoint` is called after each."""
    state = resume or LoopState(0, list(weights), list(weights.values()), {}, {}, [])
    keys, current, bases, pending, history = state.keys, state.weights, state.bases, state.pending, state.history
    started = time.monotonic()
    for rnd in range(state.round + 1, cfg.rounds + 1):
        scheduler.start_round(rnd)
        intake = _Intake()
        poll = partial(_poll, grid, scheduler, fleet, clock, pending, bases, rnd, intake)
        assignments, views = _plan(scheduler, fleet, clock, rnd, cfg, poll)
        bases[rnd] = current
        arrays = model_record(keys, current)
        now = clock.now()
        by_device = {v.device: v for v in views}
        for a in assignments:
            node, partition = fleet.target(a.device)
            pushed = push_job(grid, arrays, cfg, rnd, node, partition, epochs=a.epochs, steps=a.steps)
            view = by_device[a.device]
            msg_id = pushed[0] if pushed else f"refused-{rnd}-{a.device}"
            scheduler.dispatched(msg_id, a, now, view.heartbeat, view.board)
            if not pushed:  # e.g. the node left between planning and sending
                scheduler.lost(msg_id, now, "Flower refused the message")
                intake.lost += 1
                continue
            hb_session = view.heartbeat.session if view.heartbeat else None
            pending[msg_id] = _Sent(msg_id, a.device, rnd, hb_session)
        round_end = now + scheduler.deadline
        while True:
            poll()
            if scheduler.round_complete() or clock.now() >= round_end:
                break
            clock.wait(round_end)
        for job_id in scheduler.expire(clock.now()):
            pending.pop(job_id, None)
        current, used = scheduler.close_round(current, clock.now())
        clock.mark("round_end", round=rnd, delivered=used)
        for old in [r for r in bases if not any(s.round == r for s in pending.values())]:
            del bases[old]
        loss, accuracy = evaluate(current)
        scheduler.after_round(rnd, clock.now(), loss, scheduler.last_step_norm if used else 0.0)
        record = RoundRecord(
            round=rnd, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(intake.jobs),
            selected=len(assignments), replied=used, failed=intake.lost, samples=sum(j.samples for j in intake.jobs),
            seconds=time.monotonic() - started, virtual_seconds=clock.now() if clock.virtual else None,
        )
        history.append(record)
        on_round(record, intake.jobs, dict(zip(keys, current, strict=True)))
        if checkpoint is not None:
            checkpoint(LoopState(rnd, keys, current, bases, pending, history), scheduler)
    return FederationResult(dict(zip(keys, current, strict=True)), history)


def model_record(keys: list[str], weights: list[np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(w) for k, w in zip(keys, weights, strict=True)})


def push_job(grid: Grid, arrays: ArrayRecord, cfg: RunConfig, rnd: int, node: int, partition: int,
             epochs: int | None = None, steps: int | None = None) -> list[str]:
    """Send one training job; [] if Flower refused it (e.g. the node has just left)."""
    config = job_config(cfg, rnd, partition)
    if epochs is not None:
        config["local-epochs"] = epochs
    if steps is not None:
        config["max-steps"] = steps
    msg = Message(RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(config)}), dst_node_id=node,
                  message_type=MessageType.TRAIN, group_id=str(rnd))
    return list(grid.push_messages([msg]))


def trained_delta(reply: Message, base: list[np.ndarray]) -> list[np.ndarray] | None:
    """base - trained weights of a reply; None for an error or a reply without weights."""
    trained = reply_weights(reply)
    return None if trained is None else [b - t for b, t in zip(base, trained, strict=True)]


def reply_weights(reply: Message) -> list[np.ndarray] | None:
    """The trained weights a reply carries; None for an error or a reply without weights."""
    if reply.has_error() or ARRAYS not in reply.content:
        return None
    return reply.content[ARRAYS].to_numpy_ndarrays()


def reply_bytes(reply: Message) -> int:
    """Bytes of tensor data a reply carries, counted before any of it is decoded."""
    return sum(len(a.data) for a in reply.content[ARRAYS].values()) if ARRAYS in reply.content else 0


def reply_metrics(reply: Message) -> dict[str, float] | None:
    """The job figures a reply reports; None if any is missing or not a finite number."""
    keys = ("steps", "samples", "num-examples", "seconds", "loss", "partition-id", "samples-per-second")
    try:
        m = {k: float(reply.content[METRICS][k]) for k in keys}
    except (KeyError, TypeError, ValueError):
        return None
    return m if all(math.isfinite(v) for v in m.values()) else None


def _plan(scheduler: Scheduler, fleet: FleetView, clock: Clock, rnd: int, cfg: RunConfig,
          poll: Callable[[], None]) -> tuple[list, list]:
    """Plan the round once enough devices are free to expect `clients_per_round` updates back
    (as Flower waits for its minimum of nodes, grown by the predicted losses); after a last
    round's deadline of waiting, once enough are free to expect `min_round_share` of those
    updates; after the round timeout, with whoever is free. A fleet smaller than those counts starts once all
    of it is free. Meanwhile late jobs land.

    The middle rule matters on a fleet whose online devices barely cover a round: waiting for
    all of `clients_per_round` there leaves the free devices idle until a dropped one rejoins
    (minutes), where a round of a few fewer updates costs a little noise (docs/scheduler.md)."""
    start = clock.now()
    give_up = start + cfg.round_timeout
    settle = start + min(scheduler.deadline, cfg.round_timeout)
    while True:
        poll()
        now = clock.now()
        views = fleet.views(now)
        busy = scheduler.busy()
        free = sum(1 for v in views if v.device not in busy)
        wanted = scheduler.candidates_wanted()
        if now >= settle:
            wanted = math.ceil(cfg.min_round_share * wanted)
        wanted = min(wanted, fleet.size())  # never more than the fleet has: that wait could not end
        if free >= wanted or (free and now >= give_up):
            assignments = scheduler.plan(rnd, now, views)
            if assignments:
                return assignments, views
        if now >= give_up:
            raise EdgeschedError(f"round {rnd}: no device could take work for {cfg.round_timeout:.0f} s "
                                 f"({len(views)} online, {len(scheduler.busy())} busy)")
        clock.wait(min(give_up, now + max(1.0, cfg.round_timeout / 100)))


def _poll(grid: Grid, scheduler: Scheduler, fleet: FleetView, clock: Clock, pending: dict[str, _Sent],
          bases: dict[int, list[np.ndarray]], rnd: int, intake: _Intake) -> None:
    """Take in the replies that came, and drop the jobs whose device is gone."""
    intake.jobs += _collect(grid, scheduler, fleet, pending, bases, clock.now(), rnd)
    intake.lost += _drop_gone(scheduler, fleet, pending, clock)


def _collect(grid: Grid, scheduler: Scheduler, fleet: FleetView, pending: dict[str, _Sent],
             bases: dict[int, list[np.ndarray]], now: float, rnd: int) -> list[JobRecord]:
    """Hand every reply that came in to the scheduler; return the job records of those that counted.

    A reply far larger than the model, or with figures that are not numbers, is refused before
    its tensors are decoded; the scheduler validates the rest (edgesched.validate).
    """
    if not pending:
        return []
    counted = []
    for reply in grid.pull_messages(list(pending)):
        sent = pending.pop(reply.metadata.reply_to_message_id, None)
        if sent is None:
            continue
        base = bases[sent.round]
        if not reply.has_error() and reply_bytes(reply) > OVERSIZE * sum(b.nbytes for b in base):
            scheduler.refuse(sent.job_id, now, "oversized")
            continue
        trained = reply_weights(reply)
        if trained is None:
            reason = reply.error.reason if reply.has_error() else "no weights in the reply"
            scheduler.lost(sent.job_id, now, f"error: {reason}")
            continue
        m = reply_metrics(reply)
        if m is None:
            scheduler.refuse(sent.job_id, now, "bad_metrics")
            continue
        if DEVICE in reply.content:
            fleet.seen(reply.metadata.src_node_id, str(reply.content[DEVICE]["device-id"]))
        if scheduler.arrived(sent.job_id, now, trained, base, steps=int(m["steps"]), samples=int(m["samples"]),
                             data_size=int(m["num-examples"]), compute_s=m["seconds"], loss=m["loss"]):
            counted.append(job_record(rnd, reply))
    return counted


def vanished(fleet: FleetView, device: str, session: int | None, now: float) -> bool:
    """The device a job was sent to is offline, or its agent restarted since (`session` then)."""
    current = fleet.session(device, now)
    return current is None or (session is not None and current != session)


def _drop_gone(scheduler: Scheduler, fleet: FleetView, pending: dict[str, _Sent], clock: Clock) -> int:
    """Jobs whose device went offline, or restarted its agent, will never reply.

    A drop is stamped with the time after the fleet was consulted: on a gateway that takes
    calls to the SuperLink, during which a Last Will may come in, and a drop stamped before
    them could precede the death that caused it."""
    gone = [sent for sent in pending.values() if vanished(fleet, sent.device, sent.session, clock.now())]
    now = clock.now()
    for sent in gone:
        scheduler.lost(sent.job_id, now, "device offline")
        del pending[sent.job_id]
    return len(gone)
