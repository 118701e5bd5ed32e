"""The engine's transport over Flower's Grid: one message per job, pushed, and pulled as it comes.

Flower's `Strategy.start` sends a round and waits for all of it, so nothing could arrive late
and still count. Pushing each job with `Grid.push_messages` and pulling replies with
`Grid.pull_messages` lets the engine take each one as it lands, in any step.

A reply is pulled in two parts: the message, then its objects (the weights). When a board dies
mid-upload, Flower's pull of its objects retries until the SuperLink's upload session expires
(minutes), and the gateway would not look at its fleet meanwhile. So each pull runs in a thread
of its own, the engine waits for it only briefly, and replies to other jobs are pulled beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from edgesched.config import RunConfig
from edgesched.core.downlink import Holdings
from edgesched.core.transport import Bounds, Order, Reply, Unsent
from edgesched.flower.messages import (
    BASE_MISSING,
    DOWNLINK_BASE,
    DOWNLINK_BITS,
    DOWNLINK_TAG,
    UPLINK_BITS,
    Compressed,
    decode_reply,
    job_config,
    model_record,
    packed_record,
    train_message,
)
from edgesched.flower.nodes import NODE_LIST_TTL_S, FlowerFleet
from edgesched.trace import TraceRecorder

PULL_WAIT_S = 0.5  # how long one look at the replies may wait for pulls still under way


class _Pull:
    """One `Grid.pull_messages` for some jobs, in a daemon thread (a pull stuck on a dead
    board's upload must not keep the gateway from exiting)."""

    def __init__(self, grid: Grid, job_ids: set[str]) -> None:
        self.job_ids = job_ids
        self._messages: list[Message] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pull, args=(grid,), daemon=True, name="edgesched-pull")
        self._thread.start()

    def _pull(self, grid: Grid) -> None:
        try:
            self._messages = list(grid.pull_messages(list(self.job_ids)))
        except BaseException as exc:  # handed to the engine's thread by `messages`
            self._error = exc

    def over(self, wait_s: float) -> bool:
        """Whether the pull has ended, waiting up to `wait_s` for it."""
        self._thread.join(max(0.0, wait_s))
        return not self._thread.is_alive()

    def messages(self) -> list[Message]:
        """The replies an ended pull took in; re-raises what it raised."""
        if self._error is not None:
            raise self._error
        return self._messages


class FlowerTransport:
    def __init__(self, grid: Grid, cfg: RunConfig, nodes: FlowerFleet, keys: list[str],
                 trace: TraceRecorder | None = None) -> None:
        """`trace`: told each trained reply's device, samples and times (the run directory's trace.csv)."""
        self.grid = grid
        self.trace = trace
        self.cfg = cfg
        self.nodes = nodes
        self.keys = keys
        self._arrays: tuple[int, ArrayRecord] | None = None  # (step, its model encoded once)
        self.bytes_down = self.bytes_up = 0  # model tensors sent in jobs, and taken in from replies
        self.holdings = Holdings()  # what each board holds of the model (compressed jobs)
        self._sent: dict[str, tuple[str, int, int]] = {}  # job id -> (device, update width, bytes sent)
        self._shapes: list[tuple[int, ...]] = []
        self._pulls: list[_Pull] = []  # under way; each job is in at most one

    def send(self, device: str, step: int, order: Order, model: list[np.ndarray], deadline: float | None) -> str:
        node, partition = self.nodes.target(device)
        config = job_config(self.cfg, step, partition)
        if order.epochs is not None:
            config["local-epochs"] = order.epochs
        if order.steps is not None:
            config["max-steps"] = order.steps
        self._shapes = [w.shape for w in model]
        download = None
        if order.bits:  # the model as a difference from the board's copy, the update asked in `bits`
            download = self.holdings.download(device, model)
            arrays, sent = packed_record(self.keys, download.packed), download.nbytes
            config.update({UPLINK_BITS: order.bits, DOWNLINK_BITS: download.bits, DOWNLINK_BASE: download.base,
                           DOWNLINK_TAG: download.tag})
        else:
            if self._arrays is None or self._arrays[0] != step:  # a step's jobs all start from its model
                self._arrays = (step, model_record(self.keys, model))
            arrays, sent = self._arrays[1], sum(w.nbytes for w in model)
        pushed = list(self.grid.push_messages([train_message(arrays, config, node, step)]))
        if not pushed:  # e.g. the node left between planning and sending
            raise Unsent("Flower refused the message")
        self.bytes_down += sent
        self._sent[pushed[0]] = (device, order.bits, sent)
        if download is not None:
            self.holdings.sent(pushed[0], device, download)
        traced = self.nodes.memory.devices.get(node) if self.trace is not None else None
        if self.trace is not None and traced is not None:
            bounds = self.bounds(device, order)
            self.trace.sent(pushed[0], traced, time.time(), bounds.max_steps * bounds.batch_size)
        return pushed[0]

    def bounds(self, device: str, order: Order) -> Bounds:
        node, partition = self.nodes.target(device)
        training = self.cfg.training
        return Bounds.of(order, partition, self.nodes.samples_of(node), training.local_epochs, training.batch_size)

    def collect(self, job_ids: Sequence[str], max_bytes: float) -> list[Reply]:
        for gone in set(self._sent) - set(job_ids):  # the engine gave up on it: its reply is never read
            del self._sent[gone]
            self.holdings.drop(gone)
        wanted = set(job_ids)
        replies = [self._decode(reply, max_bytes) for reply in self._pulled(wanted)
                   if reply.metadata.reply_to_message_id in wanted]
        self.bytes_up += sum(r.moved[1] for r in replies)
        for reply in replies:
            if self.trace is not None and reply.trained is not None and reply.metrics is not None:
                self.trace.replied(reply.job_id, time.time(), reply.metrics.samples, reply.metrics.seconds)
        return replies

    def _pulled(self, wanted: set[str]) -> Iterable[Message]:
        """Replies pulled for `wanted` jobs: a pull is started for those no pull under way
        covers, and the engine waits up to PULL_WAIT_S in all for pulls to end."""
        fresh = wanted.difference(*(pull.job_ids for pull in self._pulls))
        if fresh:
            self._pulls.append(_Pull(self.grid, fresh))
        until = time.monotonic() + PULL_WAIT_S
        for pull in list(self._pulls):
            if pull.over(until - time.monotonic()):
                self._pulls.remove(pull)
                yield from pull.messages()

    def _decode(self, message: Message, max_bytes: float) -> Reply:
        """A reply, decoded as its job was sent; a compressed job's download is counted on once
        it replied, and a board that lacked the copy it was named is sent the whole model next."""
        job_id = message.metadata.reply_to_message_id
        device, bits, sent = self._sent.pop(job_id, ("", 0, 0))
        reply = decode_reply(message, job_id, max_bytes, Compressed(self.keys, self._shapes, bits) if bits else None,
                             sent)
        if reply.trained is not None:
            self.holdings.confirm(job_id)
        else:
            self.holdings.drop(job_id)
            if reply.error is not None and BASE_MISSING in reply.error:
                self.holdings.forget(device)
        return reply

    def reachable(self, now: float) -> list[str]:
        """Flower's connected nodes (Flower does not say which are busy)."""
        return [f"node-{node}" for node in self.nodes.nodes()]

    def next_change(self, now: float) -> float:
        return now + NODE_LIST_TTL_S
