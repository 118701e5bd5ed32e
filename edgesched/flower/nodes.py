"""Flower's nodes as the engine's fleet: which partition each trains, which device it runs on.

A Flower node is planned under the id `node-{id}`. Once a reply names the device it runs on
(its node config's `device-id`), the registry's heartbeats for that device feed its
predictions and risk, and its Last Will ends its jobs at once. So that this holds from a
node's first job, not only after its first reply, every node is asked its device id (a
`query` message, which the ClientApp answers without loading torch) as soon as it appears;
the answer also says how many samples a board with its own data holds. Such a board's work is
sized, its updates weighted and its replies checked by that figure, fixed for the run; other
nodes train partition `i` of the public data, the `i`-th node seen, as in the synchronous loop.
A node is not planned while its answer is awaited, nor after a failed one (a board that died
while starting the ClientApp to answer: planned blind, its job would wait for Flower to notice
the death, about a minute); it is asked again every `QUERY_RETRY_S`. What the gateway
learned of each node (its partition, its device) goes into its checkpoint, so that a restarted
gateway still knows a dead board's node: that node will never answer its query, and Flower
lists it for about a minute after its death, a minute in which an unidentified node is planned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from edgesched.core.engine import Job
from edgesched.core.fleet import DeviceView, device_view
from edgesched.core.registry import DeviceState, RegistrySnapshot
from edgesched.errors import EdgeschedError
from edgesched.flower.messages import DEVICE
from edgesched.mqtt import RegistryListener
from edgesched.observe import fleet_record
from edgesched.trace import TraceRecorder

log = logging.getLogger(__name__)
NODE_LIST_TTL_S = 1.0  # how long a fetched node list is reused while polling
NODE_WAIT_SECONDS = 120.0
QUERY_RETRY_S = 10.0  # how long a node whose identification failed waits to be asked again
MAX_LOCAL_SAMPLES = 100_000_000


@dataclass
class FleetMemory:
    """What the gateway learned of Flower's nodes: the partition each trains, the device each runs on."""

    partitions: dict[int, int] = field(default_factory=dict)
    devices: dict[int, str] = field(default_factory=dict)
    heard: set[str] = field(default_factory=set)  # devices whose agents have been heard
    samples: dict[int, int] = field(default_factory=dict)  # boards' own data sizes, as declared on joining


class FlowerFleet:
    def __init__(self, grid: Grid, telemetry: RegistryListener | None, sizes: list[int],
                 dataset: str | None = None, memory: FleetMemory | None = None, identify: bool = False,
                 trace: TraceRecorder | None = None) -> None:
        """`identify`: ask every node (as when there is telemetry), so boards can declare their own data;
        `trace`: told, whenever the fleet is read, which devices the registry has online and
        linked to a Flower node (those the gateway can send work)."""
        self._grid = grid
        self._trace = trace
        self._identify = identify or telemetry is not None
        self._dataset = dataset
        self._telemetry = telemetry
        self.sizes = sizes  # partition -> its samples
        self.memory = memory or FleetMemory()
        for node, device_id in self.memory.devices.items():
            self.seen(node, device_id)
        self._nodes_at = -np.inf
        self._nodes: list[int] = []
        self._asked: dict[str, int] = {}  # identification queries in flight: message id -> node
        self._queried: set[int] = set()  # nodes this process has asked (once each, unless it failed)
        self._failed: dict[int, float] = {}  # nodes whose identification failed -> when to ask again
        self._warned: set[int] = set()  # nodes whose silence (no agent heard, no answer) has been logged
        self._unheard_since: float | None = None

    def nodes(self) -> list[int]:
        if time.monotonic() - self._nodes_at > NODE_LIST_TTL_S:
            self._nodes = sorted(self._grid.get_node_ids())
            self._nodes_at = time.monotonic()
            for node in self._nodes:
                if self._identify and node not in self.memory.devices and node not in self._queried:
                    self._ask_device_id(node)
                elif node in self._failed and time.monotonic() >= self._failed[node]:
                    del self._failed[node]
                    self._ask_device_id(node)
                self.memory.partitions.setdefault(node, len(self.memory.partitions) % len(self.sizes))
        self._take_answers()
        return self._nodes

    def _ask_device_id(self, node: int) -> None:
        self._queried.add(node)
        msg = Message(RecordDict({}), dst_node_id=node, message_type=MessageType.QUERY, group_id="identify")
        for msg_id in self._grid.push_messages([msg]):
            self._asked[msg_id] = node

    def _take_answers(self) -> None:
        if not self._asked:
            return
        for reply in self._grid.pull_messages(list(self._asked)):
            node = self._asked.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            if not reply.has_error() and DEVICE in reply.content:
                self.seen(node, str(reply.content[DEVICE]["device-id"]))
                self._declared(node, reply.content[DEVICE].get("samples"))
            else:
                if node not in self._warned:
                    self._warned.add(node)
                    why = reply.error.reason if reply.has_error() else "no device id in its answer"
                    log.warning("node %d did not say which device it runs (%s): not planned until it does; "
                                "asked again every %.0f s", node, why, QUERY_RETRY_S)
                self._failed[node] = time.monotonic() + QUERY_RETRY_S

    def _declared(self, node: int, samples: Any) -> None:
        """A board's own data size: a whole number within reason, or the node trains a partition."""
        if samples is None:
            return
        if isinstance(samples, int) and 1 <= samples <= MAX_LOCAL_SAMPLES:
            self.memory.samples[node] = samples
        else:
            log.warning("node %d declares %r samples of its own: not a count of 1 to %d; it is planned on a "
                        "partition's size, and its replies will not match it", node, samples, MAX_LOCAL_SAMPLES)

    def samples_of(self, node: int) -> int:
        """What the node trains on: its own data's declared size, or its partition's."""
        return self.memory.samples.get(node) or self.sizes[self.memory.partitions[node]]

    def _states(self) -> dict[int, DeviceState]:
        if self._telemetry is None:
            return {}
        snapshot = self._telemetry.snapshot()
        if self._trace is not None:
            for state in snapshot.devices.values():  # usable: heard, and its Flower node known
                self._trace.presence(state.device_id, state.online and state.node_id is not None,
                                     snapshot.taken_at, state.offline_since)
        return {s.node_id: s for s in snapshot.devices.values() if s.node_id is not None}

    def views(self, now: float) -> list[DeviceView]:
        states = self._states()
        views = []
        nodes = self.nodes()  # asks new nodes, takes answers
        awaited = {*self._asked.values(), *self._failed}
        for node in nodes:
            if node in awaited:
                continue
            samples = self.samples_of(node)
            if samples == 0:  # a node with no data of its own where the gateway has none to hand out
                continue
            state = states.get(node)
            if state is not None:
                self.memory.heard.add(state.device_id)
                if state.online:
                    history = self._telemetry.history(state.device_id)
                    views.append(device_view(state, samples, history, device=f"node-{node}", dataset=self._dataset))
            elif self.memory.devices.get(node) in self.memory.heard:
                self._unheard(node, now)
            else:  # no agent (yet), or none at all: planned on its class's prior
                views.append(DeviceView(f"node-{node}", samples))
        return views

    def _unheard(self, node: int, now: float) -> None:
        """A device whose agent an earlier start of this gateway heard has not been heard since
        the restart: the board is dead (after a broker restart its Last Will may be gone too) or
        its agent is not up yet. Planned blind, a dead board's job would wait for Flower's
        heartbeat (about a minute); so it is not planned until it is heard, which a live agent is
        within one heartbeat. Silent for longer than the registry's timeout, it is worth a line
        in the log."""
        self._unheard_since = self._unheard_since or now
        if node not in self._warned and now - self._unheard_since > self._telemetry.registry.config.timeout:
            self._warned.add(node)
            log.warning("node %d runs device %r, whose agent has not been heard since the gateway restarted: "
                        "not planned until it is", node, self.memory.devices[node])

    def record(self, jobs: Iterable[Job], step: int, now: float, traffic: dict[str, int]) -> dict[str, Any]:
        """fleet.json on a gateway (edgesched.observe): the registry's devices, each training if a
        job is out on its node, and the Flower nodes no agent has spoken for, by node; `traffic`:
        the model bytes the transport moved."""
        busy_nodes = {self.target(job.device)[0] for job in jobs}
        snapshot = self._telemetry.snapshot() if self._telemetry else RegistrySnapshot(now, {}, {}, 0)
        linked = {s.node_id for s in snapshot.devices.values() if s.node_id is not None}
        busy = {s.device_id for s in snapshot.devices.values() if s.node_id in busy_nodes}
        others = [(f"node-{node}", node in busy_nodes) for node in self._nodes if node not in linked]
        return fleet_record(snapshot, busy, now, step, others, traffic)

    def target(self, device: str) -> tuple[int, int]:
        node = int(device.removeprefix("node-"))
        return node, self.memory.partitions[node]

    def session(self, device: str, now: float) -> int | None:
        node = int(device.removeprefix("node-"))
        if node not in self.nodes():
            return None
        state = self._states().get(node)
        if state is None:
            return 0
        if not state.online:
            return None
        return state.heartbeat.session if state.heartbeat else 0

    def size(self) -> int:
        """Flower's registered nodes: a dead one counts until Flower drops it (about a minute)."""
        return len(self.nodes())

    def seen(self, node: int, device_id: str) -> None:
        self.memory.devices[node] = device_id
        if self._telemetry is not None:
            self._telemetry.link_node(device_id, node)


def wait_for_nodes(grid: Grid, wanted: int) -> list[int]:
    """Block until the grid has nodes (all `wanted` or whatever came within the wait)."""
    deadline = time.monotonic() + NODE_WAIT_SECONDS
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or (nodes and time.monotonic() > deadline):
            return nodes
        if time.monotonic() > deadline:
            raise EdgeschedError(f"no client node connected within {NODE_WAIT_SECONDS:.0f} s")
        time.sleep(0.2)
