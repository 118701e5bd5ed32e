"""The engine's transport over Flower's Grid: one message per job, pushed, and pulled as it comes.

Flower's `Strategy.start` sends a round and waits for all of it, so nothing could arrive late
and still count. Pushing each job with `Grid.push_messages` and pulling replies with
`Grid.pull_messages` lets the engine take each one as it lands, in any step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from edgesched.config import RunConfig
from edgesched.core.transport import Bounds, Order, Reply, Unsent
from edgesched.flower.messages import decode_reply, job_config, model_record, train_message
from edgesched.flower.nodes import NODE_LIST_TTL_S, FlowerFleet
from edgesched.trace import TraceRecorder


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

    def send(self, device: str, step: int, order: Order, model: list[np.ndarray], deadline: float | None) -> str:
        node, partition = self.nodes.target(device)
        config = job_config(self.cfg, step, partition)
        if order.epochs is not None:
            config["local-epochs"] = order.epochs
        if order.steps is not None:
            config["max-steps"] = order.steps
        if self._arrays is None or self._arrays[0] != step:  # a step's jobs all start from its model
            self._arrays = (step, model_record(self.keys, model))
        pushed = list(self.grid.push_messages([train_message(self._arrays[1], config, node, step)]))
        if not pushed:  # e.g. the node left between planning and sending
            raise Unsent("Flower refused the message")
        self.bytes_down += sum(w.nbytes for w in model)
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
        replies = [decode_reply(reply, reply.metadata.reply_to_message_id, max_bytes)
                   for reply in self.grid.pull_messages(list(job_ids))]
        self.bytes_up += sum(w.nbytes for r in replies if r.trained is not None for w in r.trained)
        for reply in replies:
            if self.trace is not None and reply.trained is not None and reply.metrics is not None:
                self.trace.replied(reply.job_id, time.time(), reply.metrics.samples, reply.metrics.seconds)
        return replies

    def reachable(self, now: float) -> list[str]:
        """Flower's connected nodes (Flower does not say which are busy)."""
        return [f"node-{node}" for node in self.nodes.nodes()]

    def next_change(self, now: float) -> float:
        return now + NODE_LIST_TTL_S
