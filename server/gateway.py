"""The adaptive scheduler on a gateway: Flower's nodes, the MQTT registry, the wall clock.

A Flower node is planned under the id `node-{id}`. Once a reply names the device it runs on
(its node config's `device-id`), the registry's heartbeats for that device feed its
predictions and risk, and its Last Will ends its jobs at once. So that this holds from a
node's first job, not only after its first reply, every node is asked its device id (a
`query` message, which the ClientApp answers without loading torch) as soon as it appears.
Partition `i` is trained by the `i`-th node seen, as in the synchronous loop. What the gateway
learned of each node (its partition, its device) goes into its checkpoint, so that a restarted
gateway still knows a dead board's node: that node will never answer its query, and Flower
lists it for about a minute after its death, a minute in which an unidentified node is planned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import Message, MessageType, RecordDict

from edgesched import data, partition
from edgesched.config import RunConfig
from edgesched.errors import ConfigError
from edgesched.jobs import DEVICE
from edgesched.models import model_size
from edgesched.mqtt import RegistryListener
from edgesched.predict import Predictor
from edgesched.registry import DeviceState
from edgesched.results import RoundCallback, read_checkpoint, write_checkpoint
from edgesched.scheduler import DeviceView, Scheduler, SchedulerConfig, device_view
from edgesched.server.federation import FederationResult, wait_for_nodes
from edgesched.server.semi_async import LoopState, WallClock, run_semi_async

log = logging.getLogger(__name__)
CHECKPOINT = "gateway-checkpoint.pkl"
CHECKPOINT_FORMAT = 1  # raised whenever a class the checkpoint pickles changes incompatibly
NODE_LIST_TTL_S = 1.0  # how long a fetched node list is reused while polling


@dataclass
class FleetMemory:
    """What the gateway learned of Flower's nodes: the partition each trains, the device each runs on."""

    partitions: dict[int, int] = field(default_factory=dict)
    devices: dict[int, str] = field(default_factory=dict)
    heard: set[str] = field(default_factory=set)  # devices whose agents have been heard


class GatewayFleet:
    def __init__(self, grid: object, telemetry: RegistryListener | None, sizes: list[int],
                 dataset: str | None = None, memory: FleetMemory | None = None) -> None:
        self._grid = grid
        self._dataset = dataset
        self._telemetry = telemetry
        self._sizes = sizes
        self.memory = memory or FleetMemory()
        for node, device_id in self.memory.devices.items():
            self.seen(node, device_id)
        self._nodes_at = -np.inf
        self._nodes: list[int] = []
        self._asked: dict[str, int] = {}  # identification queries in flight: message id -> node
        self._queried: set[int] = set()  # nodes this process has asked (once each)
        self._warned: set[int] = set()  # nodes whose device's silence has been logged
        self._unheard_since: float | None = None

    def nodes(self) -> list[int]:
        if time.monotonic() - self._nodes_at > NODE_LIST_TTL_S:
            self._nodes = sorted(self._grid.get_node_ids())
            self._nodes_at = time.monotonic()
            for node in self._nodes:
                if self._telemetry is not None and node not in self.memory.devices and node not in self._queried:
                    self._ask_device_id(node)
                self.memory.partitions.setdefault(node, len(self.memory.partitions) % len(self._sizes))
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
            if node is not None and not reply.has_error() and DEVICE in reply.content:
                self.seen(node, str(reply.content[DEVICE]["device-id"]))

    def _states(self) -> dict[int, DeviceState]:
        if self._telemetry is None:
            return {}
        snapshot = self._telemetry.snapshot()
        return {s.node_id: s for s in snapshot.devices.values() if s.node_id is not None}

    def views(self, now: float) -> list[DeviceView]:
        states = self._states()
        views = []
        for node in self.nodes():
            samples = self._sizes[self.memory.partitions[node]]
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


@dataclass
class GatewayCheckpoint:
    """What a restarted gateway needs to go on: whose run, the loop's state, the scheduler."""

    config: RunConfig
    loop: LoopState
    scheduler: Scheduler
    logs: dict[str, int] | None = None  # the run directory's logs' sizes (RunRecorder.offsets)
    fleet: FleetMemory | None = None
    format: int = CHECKPOINT_FORMAT


def run_adaptive(grid: object, cfg: RunConfig, on_round: RoundCallback,
                 telemetry: RegistryListener | None = None,
                 logs: Callable[[], dict[str, int]] | None = None,
                 saved: GatewayCheckpoint | None = None) -> FederationResult:
    """The adaptive scheduler's run on a gateway (or over the plain simulation's nodes).

    With `checkpoint-dir` set, a checkpoint is written there after every round, and a gateway
    restarted with the same config continues from it; jobs that were in flight count as lost
    (they belonged to the stopped Flower run), and their devices are planned afresh. `logs`
    gives the run directory's log sizes to keep with each checkpoint; `saved` is the checkpoint
    to go on from, if the caller has read it already (`saved_run`).
    """
    from edgesched.models import build_model
    from edgesched.training import scorer

    ds = data.load(cfg.dataset, cfg.data_dir)
    sizes = [len(p) for p in partition.partition(ds.y_train, ds.groups, cfg.partitioner or "iid", cfg.clients or 1,
                                                 cfg.alpha, cfg.seed)]
    model = build_model(cfg.dataset, cfg.seed)
    saved = saved or saved_run(cfg)
    wait_for_nodes(grid, 1 if saved else cfg.clients or 1)  # a resumed run goes on with whoever is there
    size = model_size(cfg.dataset)
    scheduler = saved.scheduler if saved else Scheduler(SchedulerConfig.from_run(cfg),
                                                         Predictor(4 * size["model_parameters"]))
    if saved:
        log.info("resuming after round %d of %d", saved.loop.round, cfg.rounds)
        for job_id in saved.loop.pending:
            scheduler.lost(job_id, time.time(), "gateway restarted")
        saved.loop.pending.clear()
        saved.loop.bases.clear()
    path = Path(cfg.checkpoint_dir) / CHECKPOINT if cfg.checkpoint_dir else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
    fleet = GatewayFleet(grid, telemetry, sizes, cfg.dataset, saved and saved.fleet)
    save = (lambda loop, s: write_checkpoint(path, GatewayCheckpoint(cfg, loop, s, logs and logs(), fleet.memory))
            ) if path else None
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    result = run_semi_async(grid, WallClock(), fleet, scheduler, cfg, weights, scorer(model, ds.x_test, ds.y_test),
                            on_round, saved and saved.loop, save)
    if path:
        path.unlink(missing_ok=True)  # the run is complete
    return FederationResult(result.weights, result.rounds, scheduler.log)


def saved_run(cfg: RunConfig) -> GatewayCheckpoint | None:
    """This run's checkpoint in `checkpoint-dir`, if a previous start of it left one."""
    if not cfg.checkpoint_dir or not (path := Path(cfg.checkpoint_dir) / CHECKPOINT).exists():
        return None
    saved = read_checkpoint(path, GatewayCheckpoint)
    if saved.config != cfg:
        raise ConfigError(f"{path} holds a checkpoint of another run (other settings); move it away to start afresh")
    return saved
