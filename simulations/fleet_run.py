"""Run a virtual fleet: real training, virtual time, Flower FedAvg or edgesched's scheduler.

- `fedavg`: Flower's stock FedAvg over a `VirtualGrid`. It samples from the devices online at
  the current virtual time, waits for each round's replies up to the round timeout in
  virtual seconds, and aggregates what arrived.
- `edgesched`: the adaptive scheduler's semi-asynchronous loop (edgesched.server.semi_async)
  over the same grid. It plans from the registry the devices' heartbeats feed, and writes
  decisions.jsonl and decisions.png.

Either way the global model is evaluated on the held-out test set after every round, and the
virtual devices' telemetry goes to a registry over the in-process bus, or over a real MQTT
broker with `broker` ("embedded" starts one on loopback). Outputs beside the plain
simulation's: events.jsonl (every dispatch, download, compute, upload, dropout, heartbeat and
deadline, virtual time first), rounds.csv with virtual time, the time to the fleet's target
accuracy in summary.json, accuracy_vs_time.png and timeline.png.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from edgesched import data, partition
from edgesched.config import RunConfig
from edgesched.errors import EdgeschedError
from edgesched.models import model_size
from edgesched.registry import DeviceRegistry, RegistryConfig
from edgesched.results import JobRecord, RoundRecord, RunRecorder, plot_accuracy, prediction_error
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.engine import run_engine, workers
from edgesched.simulations.fleet import FleetSpec
from edgesched.simulations.heartbeats import Bus, InProcessBus, MqttBus, VirtualTelemetry
from edgesched.simulations.progress import RoundProgress
from edgesched.simulations.timeline import plot_timeline

IN_PROCESS = "in-process"


def simulate_fleet(spec: FleetSpec, out_dir: Path, broker: str = IN_PROCESS) -> dict[str, Any]:
    """Run the fleet with `spec.run.strategy`; telemetry over `broker` (in-process, embedded or a URL)."""
    cfg = spec.run
    strategy = cfg.strategy
    dataset = data.load(cfg.dataset, cfg.data_dir)  # fail fast on missing data, before Ray starts
    sizes = [len(p) for p in partition.partition(dataset.y_train, dataset.groups, cfg.partitioner or "iid",
                                                 spec.size, cfg.alpha, cfg.seed)]
    size = model_size(cfg.dataset)
    fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
    config = {**cfg.to_mapping(), "fleet": spec.name, "fleet-file": str(spec.path), "strategy": strategy,
              "dropout": spec.dynamics.dropout, "target-accuracy": spec.target_accuracy, "telemetry": broker}
    state: dict[str, Any] = {}
    registry = DeviceRegistry(RegistryConfig(fleet=spec.name, heartbeat_interval=spec.dynamics.heartbeat_s))
    with _bus(broker, spec.name) as bus:  # a broker that cannot be reached fails before anything is written
        recorder = RunRecorder(out_dir, config)
        started = time.monotonic()
        telemetry = VirtualTelemetry(fleet, registry, bus)
        with (out_dir / "events.jsonl").open("w") as events, RoundProgress(cfg.rounds) as progress:

            def on_round(record: RoundRecord, jobs: list[JobRecord]) -> None:
                recorder.on_round(record, jobs)
                progress.on_round(record, jobs)

            def main(grid: Any, context: Any) -> None:
                from edgesched.simulations.virtual_grid import VirtualGrid

                vgrid = VirtualGrid(grid, fleet, cfg, sizes, events, cfg.clients_per_round, telemetry, workers(cfg))
                run = _edgesched if strategy == "edgesched" else _fedavg
                state["weights"], state["extra"] = run(vgrid, spec, telemetry, sizes, on_round, recorder)
                vgrid.finish()
                state["grid"] = vgrid

            run_engine(main, cfg, num_nodes=workers(cfg))
    if "weights" not in state:
        raise EdgeschedError(f"the simulation ended without a result; see {out_dir} for the rounds it finished")
    reached = next((r.virtual_seconds for r in recorder.rounds if r.accuracy >= spec.target_accuracy), None)
    summary = recorder.finish(state["weights"], {
        "seconds": round(time.monotonic() - started, 2), "dataset": cfg.dataset, "clients": spec.size,
        "fleet": spec.name, "strategy": strategy,
        "virtual_seconds": recorder.rounds[-1].virtual_seconds if recorder.rounds else 0.0,
        "target_accuracy": spec.target_accuracy, "time_to_target_s": reached,
        "device_seconds": round(state["grid"].device_seconds, 3),
        "telemetry_dropped": dict(registry.dropped), **state.get("extra", {}), **size,
    })
    plot_accuracy(recorder.rounds, out_dir / "accuracy_vs_time.png", virtual_time=True)
    plot_timeline(out_dir / "events.jsonl", out_dir / "timeline.png")
    return summary


@contextmanager
def _bus(broker: str, fleet: str) -> Iterator[Bus]:
    """The telemetry transport: in-process, the embedded broker on a free port, or a broker URL."""
    with ExitStack() as stack:
        if broker == IN_PROCESS:
            bus: Bus = InProcessBus()
        else:
            if broker == "embedded":
                from edgesched.broker import EmbeddedBroker

                broker = stack.enter_context(EmbeddedBroker()).url
            bus = MqttBus(broker, fleet)
        stack.callback(bus.close)
        yield bus


def _evaluator(cfg: RunConfig) -> tuple[Any, Any]:
    """(model, evaluate(weights) -> (loss, accuracy)) on the held-out test set."""
    import torch

    from edgesched.models import build_model
    from edgesched.training import evaluate

    test = data.load(cfg.dataset, cfg.data_dir)
    model = build_model(cfg.dataset, cfg.seed)
    keys = list(model.state_dict())

    def run(weights: list[np.ndarray]) -> tuple[float, float]:
        model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights, strict=True)})
        return evaluate(model, test.x_test, test.y_test)

    return model, run


def _fedavg(vgrid: Any, spec: FleetSpec, telemetry: VirtualTelemetry, sizes: list[int], on_round: Any,
            recorder: RunRecorder) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg

    from edgesched.server.federation import job_record, mean_train_loss

    cfg = spec.run
    model, evaluate = _evaluator(cfg)
    started = time.monotonic()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        loss, accuracy = evaluate(list(arrays.to_numpy_ndarrays()))
        if server_round > 0 and vgrid.last is not None:
            jobs = [job_record(server_round, r) for r in vgrid.last_replies]
            out = vgrid.last
            on_round(RoundRecord(
                round=server_round, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(jobs),
                selected=out.selected, replied=out.delivered, failed=out.dropped + out.late,
                samples=sum(j.samples for j in jobs), seconds=time.monotonic() - started,
                virtual_seconds=out.ended_at,
            ), jobs)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    # The grid offers exactly clients_per_round candidates; FedAvg takes them all.
    strategy = FedAvg(fraction_train=cfg.fraction_train, fraction_evaluate=0.0,
                      min_train_nodes=cfg.clients_per_round, min_available_nodes=cfg.clients_per_round)
    result = strategy.start(grid=vgrid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=cfg.rounds,
                            timeout=cfg.round_timeout, train_config=ConfigRecord({"lr": cfg.lr}),
                            evaluate_fn=evaluate_fn)
    return {k: v.numpy() for k, v in result.arrays.to_torch_state_dict().items()}, {}


def _edgesched(vgrid: Any, spec: FleetSpec, telemetry: VirtualTelemetry, sizes: list[int], on_round: Any,
               recorder: RunRecorder) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from edgesched.predict import Predictor
    from edgesched.scheduler import Scheduler, SchedulerConfig
    from edgesched.server.semi_async import run_semi_async
    from edgesched.simulations.heartbeats import RegistryFleetView

    cfg = spec.run
    model, evaluate = _evaluator(cfg)
    size = model_size(cfg.dataset)
    predictor = Predictor(4 * size["model_parameters"], _class_priors(size["model_macs_per_sample"]))
    scheduler = Scheduler(SchedulerConfig.from_run(cfg), predictor)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    try:
        result = run_semi_async(vgrid, vgrid, RegistryFleetView(telemetry, sizes), scheduler, cfg, weights, evaluate,
                                on_round)
    finally:
        recorder.write_decisions(scheduler.log)
    return result.weights, {"prediction_error": prediction_error(scheduler.log, after_round=5)}


def _class_priors(macs_per_sample: int) -> dict[str, float]:
    """Seconds per training sample of each catalog board: the predictor's cold start."""
    return {name: board.train_seconds(macs_per_sample, 1) for name, board in load_catalog().boards.items()}
