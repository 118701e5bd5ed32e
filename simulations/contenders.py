"""Every strategy a virtual fleet can run, on the same virtual grid, clock, data and seed.

- `fedavg`, `fedprox`: Flower's stock strategies, synchronous: a round waits for every sampled
  device or the round timeout. FedProx's clients add mu/2 ||w - w_global||^2 (`proximal-mu`).
- `deadline`: Flower's FedAvg as production FL runs it (Bonawitz et al., 2019): 130 % of the
  wanted devices are sampled, and what has not arrived by a fixed deadline is dropped. The
  deadline is what an operator who knows the hardware would set: the 90 % quantile of the
  fleet's nominal job times (catalog speed, mean link), fixed for the run.
- `fedbuff`: buffered asynchronous aggregation (simulations/fedbuff.py).
- `edgesched`: the adaptive scheduler; its ablations switch one mechanism off:
  `edgesched-no-prediction` (catalog priors only, nothing learned from jobs or reported speeds),
  `edgesched-no-staleness` (an update that misses its round never counts),
  `edgesched-no-equal-finish` (every device does exactly one epoch, fast or slow).
- `oracle`: edgesched's planner fed the true future instead of predictions (simulations/oracle.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesched import data
from edgesched.config import RunConfig
from edgesched.models import model_size
from edgesched.results import RoundCallback, RoundRecord, RunRecorder, prediction_error
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import FleetSpec
from edgesched.simulations.heartbeats import RegistryFleetView, VirtualTelemetry

if TYPE_CHECKING:
    from edgesched.server.semi_async import SaveState

Weights = dict[str, np.ndarray]
DEADLINE_OVERSELECT = 1.3
# Each ablation turns one mechanism off; without equal-finish work every device trains FedAvg's
# local epochs, however fast or slow it is.
ABLATIONS: dict[str, Callable[[RunConfig], dict[str, Any]]] = {
    "edgesched-no-staleness": lambda cfg: {"max_staleness": 0},
    "edgesched-no-equal-finish": lambda cfg: {"min_epochs": float(cfg.local_epochs or 1),
                                              "max_epochs": cfg.local_epochs},
}


def devices_per_round(cfg: RunConfig) -> int:
    """How many devices a synchronous round samples."""
    factor = DEADLINE_OVERSELECT if cfg.strategy == "deadline" else 1.0
    return math.ceil(cfg.clients_per_round * factor)


def run_contender(vgrid: Any, spec: FleetSpec, fleet: VirtualFleet, telemetry: VirtualTelemetry, sizes: list[int],
                  on_round: RoundCallback, recorder: RunRecorder, checkpoint: SaveState | None = None,
                  resume: Any = None) -> tuple[Weights, dict[str, Any]]:
    """Run `spec.run.strategy` on the grid; returns the final weights and extra summary figures.

    The scheduler's strategies call `checkpoint` after every round and continue from `resume`
    (a simulations.checkpoint.Checkpoint) if given."""
    strategy = spec.run.strategy
    if strategy in ("fedavg", "fedprox", "deadline"):
        return _flower(vgrid, spec, fleet, sizes, on_round)
    if strategy == "fedbuff":
        from edgesched.simulations.fedbuff import run_fedbuff

        model, evaluate = _evaluator(spec.run)
        result = run_fedbuff(vgrid, vgrid, RegistryFleetView(telemetry, sizes), spec.run, _weights(model), evaluate,
                             on_round)
        return result.weights, {}
    return _scheduler(vgrid, spec, fleet, telemetry, sizes, on_round, recorder, checkpoint, resume)


def _evaluator(cfg: RunConfig) -> tuple[Any, Callable[[list[np.ndarray]], tuple[float, float]]]:
    """(model, evaluate(weights) -> (loss, accuracy)) on the held-out test set."""
    from edgesched.models import build_model
    from edgesched.training import scorer

    test = data.load(cfg.dataset, cfg.data_dir)
    model = build_model(cfg.dataset, cfg.seed)
    return model, scorer(model, test.x_test, test.y_test)


def _weights(model: Any) -> Weights:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def nominal_deadline(fleet: VirtualFleet, sizes: list[int], cfg: RunConfig, quantile: float = 0.9) -> float:
    """The quantile of the devices' nominal job times (one job's epochs of their data)."""
    epochs = cfg.local_epochs or 1
    return float(np.quantile([fleet.nominal_job_s(i, epochs * n) for i, n in enumerate(sizes)], quantile))


def _flower(vgrid: Any, spec: FleetSpec, fleet: VirtualFleet, sizes: list[int],
            on_round: RoundCallback) -> tuple[Weights, dict[str, Any]]:
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg, FedProx

    from edgesched.server.federation import job_record, mean_train_loss

    cfg = spec.run
    model, evaluate = _evaluator(cfg)
    started = time.monotonic()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weights = list(arrays.to_numpy_ndarrays())
        loss, accuracy = evaluate(weights)
        if server_round > 0 and vgrid.last is not None:
            jobs = [job_record(server_round, r) for r in vgrid.last_replies]
            out = vgrid.last
            on_round(RoundRecord(
                round=server_round, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(jobs),
                selected=out.selected, replied=out.delivered, failed=out.dropped + out.late,
                samples=sum(j.samples for j in jobs), seconds=time.monotonic() - started,
                virtual_seconds=out.ended_at,
            ), jobs, dict(zip(arrays.keys(), weights, strict=True)))
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    # The grid offers exactly devices_per_round candidates; the strategy takes them all.
    n = devices_per_round(cfg)
    common = {"fraction_train": 1.0, "fraction_evaluate": 0.0, "min_train_nodes": n, "min_available_nodes": n}
    strategy = FedProx(proximal_mu=cfg.proximal_mu, **common) if cfg.strategy == "fedprox" else FedAvg(**common)
    timeout = nominal_deadline(fleet, sizes, cfg) if cfg.strategy == "deadline" else cfg.round_timeout
    result = strategy.start(grid=vgrid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=cfg.rounds,
                            timeout=timeout, train_config=ConfigRecord({"lr": cfg.lr}), evaluate_fn=evaluate_fn)
    extra = {"deadline_s": round(timeout, 3)} if cfg.strategy == "deadline" else {}
    return {k: v.numpy() for k, v in result.arrays.to_torch_state_dict().items()}, extra


def _scheduler(vgrid: Any, spec: FleetSpec, fleet: VirtualFleet, telemetry: VirtualTelemetry, sizes: list[int],
               on_round: RoundCallback, recorder: RunRecorder, checkpoint: SaveState | None,
               resume: Any) -> tuple[Weights, dict[str, Any]]:
    from edgesched.predict import Predictor, PredictorConfig
    from edgesched.scheduler import Scheduler, SchedulerConfig
    from edgesched.server.semi_async import run_semi_async
    from edgesched.simulations.oracle import Foresight, OraclePredictor, OracleRisk

    strategy = spec.run.strategy
    cfg = dataclasses.replace(spec.run, **ABLATIONS[strategy](spec.run) if strategy in ABLATIONS else {})
    model, evaluate = _evaluator(cfg)
    size = model_size(cfg.dataset)
    model_bytes = 4 * size["model_parameters"]
    sched_cfg = SchedulerConfig.from_run(cfg)
    if resume is not None:
        scheduler = resume.scheduler
    elif strategy == "oracle":
        foresight = Foresight(fleet, sizes, vgrid.now)
        scheduler = Scheduler(sched_cfg, OraclePredictor(foresight, model_bytes),
                              OracleRisk(foresight, sched_cfg.battery_reserve))
    else:
        learn = strategy != "edgesched-no-prediction"
        predictor = Predictor(model_bytes, _class_priors(size["model_macs_per_sample"]), PredictorConfig(learn=learn))
        scheduler = Scheduler(sched_cfg, predictor)
    try:
        result = run_semi_async(vgrid, vgrid, RegistryFleetView(telemetry, sizes), scheduler, cfg, _weights(model),
                                evaluate, on_round, resume and resume.loop, checkpoint)
    finally:
        recorder.write_decisions(scheduler.log)
    guard = scheduler.guard
    return result.weights, {"prediction_error": prediction_error(scheduler.log, after_round=5),
                            "refused_updates": dict(guard.refused), "clipped_updates": guard.clipped}


def _class_priors(macs_per_sample: int) -> dict[str, float]:
    """Seconds per training sample of each catalog board: the predictor's cold start."""
    return {name: board.train_seconds(macs_per_sample, 1) for name, board in load_catalog().boards.items()}
