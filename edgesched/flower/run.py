"""A run over Flower's Grid in real time: the gateway's ServerApp, and the plain simulation's.

The engine drives one policy (`fedavg` or `edgesched`) over Flower's nodes: the wall clock,
the nodes as a fleet (joined to the MQTT registry when there is one), each job a message. A
run continues from `resume` (a gateway's checkpoint), writing off the jobs the stopped run had
in flight: they belonged to the stopped Flower run, and their devices are planned afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from edgesched import partition
from edgesched.config import GATEWAY_STRATEGIES, RunConfig
from edgesched.core import policies
from edgesched.core.decisions import Decision
from edgesched.core.engine import Engine, EngineState
from edgesched.core.events import Event
from edgesched.core.predict import Predictor
from edgesched.core.records import RoundCallback, RoundRecord
from edgesched.errors import ConfigError, EdgeschedError
from edgesched.flower.nodes import FleetMemory, FlowerFleet, wait_for_nodes
from edgesched.flower.transport import FlowerTransport
from edgesched.mqtt import RegistryListener
from edgesched.trace import TraceRecorder

log = logging.getLogger(__name__)


class WallClock:
    """Deployment time: Unix seconds (the registry's clock), polling every `poll_s`."""

    virtual = False

    def __init__(self, poll_s: float = 0.2) -> None:
        self.poll_s = poll_s

    def now(self) -> float:
        return time.time()

    def wait(self, until: float) -> None:
        time.sleep(max(0.0, min(self.poll_s, until - time.time())))

    def mark(self, event: Event) -> None:
        """The gateway's log has the steps already."""

    def expect(self, at: float, event: Event) -> None:
        """Nothing to note ahead on the wall clock."""


@dataclass
class Saved:
    """What a gateway restarted mid-run goes on from."""

    state: EngineState
    policy: policies.Policy
    fleet: FleetMemory


@dataclass(frozen=True)
class RunResult:
    weights: dict[str, np.ndarray]
    rounds: list[RoundRecord]
    decisions: list[Decision] = field(default_factory=list)  # the adaptive scheduler's log
    stopped: str | None = None  # why the run ended before its last step, if it did
    traffic: dict[str, int] = field(default_factory=dict)  # model bytes moved: bytes_down, bytes_up


def run_on_grid(grid: Grid, cfg: RunConfig, on_round: RoundCallback, telemetry: RegistryListener | None = None,
                resume: Saved | None = None, save: Callable[[Saved], None] | None = None,
                watch: Callable[[Callable[[], dict[str, Any]], bool], None] | None = None,
                identify: bool = False, trace: TraceRecorder | None = None) -> RunResult:
    """Run `cfg.rounds` server steps of `cfg.strategy` on the grid's nodes; `save` after each;
    `watch` is shown the fleet as it goes (RunRecorder.write_fleet: the run directory's fleet.json);
    `identify`: ask each node what it is and what data it holds (a gateway's real boards);
    `trace`: shown the fleet's comings and goings and its jobs' times (edgesched.trace)."""
    from edgesched.tasks import build_model, load_data, model_size
    from edgesched.training import scorer

    check_strategy(cfg)
    ds = load_data(cfg.data.dataset, cfg.data.data_dir)
    sizes = [len(p) for p in partition.partition(ds.y_train, ds.groups, cfg.data.partitioner, cfg.data.clients,
                                                 cfg.data.alpha, cfg.seed)] if len(ds.y_train) else \
        [0] * cfg.data.clients  # a gateway with an evaluation set only: every board brings its own data
    model = build_model(cfg.data.dataset, cfg.seed)
    wait_for_nodes(grid, 1 if resume else cfg.data.clients)  # a resumed run goes on with whoever is there
    fleet = FlowerFleet(grid, telemetry, sizes, cfg.data.dataset, resume.fleet if resume else None, identify, trace)
    if resume is not None:
        log.info("resuming after round %d of %d", resume.state.step, cfg.rounds)
        state, policy = resume.state, resume.policy
    else:
        state = EngineState.start({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
        policy = policies.fedavg(cfg) if cfg.strategy == "fedavg" else \
            policies.edgesched(cfg, Predictor(4 * model_size(cfg.data.dataset)["model_parameters"]))
    started = time.monotonic()
    checkpoint = (lambda s: save(Saved(s, policy, fleet.memory))) if save is not None else None
    transport = FlowerTransport(grid, cfg, fleet, state.keys, trace)

    def shown(at: EngineState, settled: bool) -> None:
        assert watch is not None
        watch(lambda: fleet.record(at.jobs.values(), at.step, time.time(),
                                   {"down": transport.bytes_down, "up": transport.bytes_up}), settled)

    engine = Engine(policy, transport, WallClock(), fleet,
                    scorer(model, ds.x_test, ds.y_test), on_round, lambda: time.monotonic() - started, checkpoint,
                    shown if watch is not None else None, overlap=cfg.overlap)
    if resume is not None:
        engine.write_off(state, list(state.jobs), time.time(), "gateway restarted")
    stopped = None
    try:
        engine.run(state, cfg.rounds, time.time() + cfg.time_budget if cfg.time_budget else None)
    except EdgeschedError as exc:  # the fleet cannot go on (e.g. every device stuck): keep what was trained
        log.error("the run stops after round %d of %d: %s", state.step, cfg.rounds, exc)
        stopped = str(exc)
    return RunResult(state.weights(), state.history, list(policy.log), stopped,
                     {"bytes_down": transport.bytes_down, "bytes_up": transport.bytes_up})


def check_strategy(cfg: RunConfig) -> None:
    """A gateway runs FedAvg or the adaptive scheduler; the other strategies need a virtual fleet."""
    if cfg.strategy not in GATEWAY_STRATEGIES:
        raise ConfigError(f"strategy {cfg.strategy!r} is a baseline of the fleet simulator (edgesched "
                          f"simulate --fleet); a gateway runs {' or '.join(GATEWAY_STRATEGIES)}")
