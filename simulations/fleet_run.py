"""Run a virtual fleet: Flower's stock FedAvg over a `VirtualGrid`, real training, virtual time.

The strategy samples from the devices online at the current virtual time, waits for each
round's replies up to the round timeout in virtual seconds, and aggregates what arrived; the
global model is evaluated on the held-out test set after every round. Outputs beside the
plain simulation's: events.jsonl (every dispatch, download, compute, upload, dropout and
deadline, virtual time first), rounds.csv with virtual time, the time to the fleet's target
accuracy in summary.json, accuracy_vs_time.png and timeline.png (who trained when, who dropped).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edgesched import data, partition
from edgesched.errors import ConfigError, EdgeschedError
from edgesched.models import model_size
from edgesched.results import RoundRecord, RunRecorder, plot_accuracy
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.engine import run_engine, workers
from edgesched.simulations.fleet import FleetSpec
from edgesched.simulations.progress import RoundProgress
from edgesched.simulations.timeline import plot_timeline

STRATEGIES = ("fedavg",)


def simulate_fleet(spec: FleetSpec, out_dir: Path, strategy: str = "fedavg") -> dict[str, Any]:
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    cfg = spec.run
    dataset = data.load(cfg.dataset, cfg.data_dir)  # fail fast on missing data, before Ray starts
    sizes = [len(p) for p in partition.partition(dataset.y_train, dataset.groups, cfg.partitioner or "iid",
                                                 spec.size, cfg.alpha, cfg.seed)]
    size = model_size(cfg.dataset)
    fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
    config = {**cfg.to_mapping(), "fleet": spec.name, "fleet-file": str(spec.path), "strategy": strategy,
              "dropout": spec.dynamics.dropout, "target-accuracy": spec.target_accuracy}
    recorder = RunRecorder(out_dir, config)
    started = time.monotonic()
    state: dict[str, Any] = {}
    with (out_dir / "events.jsonl").open("w") as events, RoundProgress(cfg.rounds) as progress:

        def main(grid: Any, context: Any) -> None:
            state["weights"], state["grid"] = _fedavg(grid, spec, fleet, sizes, events, recorder, progress, started)

        run_engine(main, cfg, num_nodes=workers(cfg))
    if "weights" not in state:
        raise EdgeschedError(f"the simulation ended without a result; see {out_dir} for the rounds it finished")
    reached = next((r.virtual_seconds for r in recorder.rounds if r.accuracy >= spec.target_accuracy), None)
    vgrid = state["grid"]
    summary = recorder.finish(state["weights"], {
        "seconds": round(time.monotonic() - started, 2), "dataset": cfg.dataset, "clients": spec.size,
        "fleet": spec.name, "strategy": strategy,
        "virtual_seconds": recorder.rounds[-1].virtual_seconds if recorder.rounds else 0.0,
        "target_accuracy": spec.target_accuracy, "time_to_target_s": reached,
        "device_seconds": round(vgrid.device_seconds, 3), **size,
    })
    plot_accuracy(recorder.rounds, out_dir / "accuracy_vs_time.png", virtual_time=True)
    plot_timeline(out_dir / "events.jsonl", out_dir / "timeline.png")
    return summary


def _fedavg(grid: Any, spec: FleetSpec, fleet: VirtualFleet, sizes: list[int], events: Any,
            recorder: RunRecorder, progress: RoundProgress, started: float) -> tuple[dict, Any]:
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg

    from edgesched.models import build_model
    from edgesched.server.federation import job_record, mean_train_loss
    from edgesched.simulations.virtual_grid import VirtualGrid
    from edgesched.training import evaluate

    cfg = spec.run
    test = data.load(cfg.dataset, cfg.data_dir)
    model = build_model(cfg.dataset, cfg.seed)
    vgrid = VirtualGrid(grid, fleet, cfg, sizes, events, per_round=cfg.clients_per_round)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, test.x_test, test.y_test)
        if server_round > 0 and vgrid.last is not None:
            jobs = [job_record(server_round, r) for r in vgrid.last_replies]
            out = vgrid.last
            record = RoundRecord(
                round=server_round, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(jobs),
                selected=out.selected, replied=out.delivered, failed=out.dropped + out.late,
                samples=sum(j.samples for j in jobs), seconds=time.monotonic() - started,
                virtual_seconds=out.ended_at,
            )
            recorder.on_round(record, jobs)
            progress.on_round(record, jobs)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    # The grid offers exactly clients_per_round candidates; FedAvg takes them all.
    strategy = FedAvg(fraction_train=cfg.fraction_train, fraction_evaluate=0.0,
                      min_train_nodes=cfg.clients_per_round, min_available_nodes=cfg.clients_per_round)
    result = strategy.start(grid=vgrid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=cfg.rounds,
                            timeout=cfg.round_timeout, train_config=ConfigRecord({"lr": cfg.lr}),
                            evaluate_fn=evaluate_fn)
    vgrid.finish()
    weights = {k: v.numpy() for k, v in result.arrays.to_torch_state_dict().items()}
    return weights, vgrid
