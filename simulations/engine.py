"""Run a federation on Flower's simulation engine (Ray) and write the run directory.

Ray starts one worker per `client-cpus` share of the machine's cores; each worker trains
whichever partition a message names. Ray's and Flower's own logging is turned down so the
user sees edgesched's progress; client failures are counted in the results instead.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesched import data
from edgesched.config import RunConfig
from edgesched.core.decisions import prediction_error
from edgesched.core.records import JobRecord, Model, RoundRecord
from edgesched.errors import EdgeschedError
from edgesched.models import model_size
from edgesched.rundir import RunRecorder
from edgesched.simulations.progress import RoundProgress

if TYPE_CHECKING:
    from flwr.app import Context
    from flwr.serverapp import Grid


def simulate(cfg: RunConfig, out_dir: Path) -> dict[str, Any]:
    """Run `cfg` (already resolved) and return the summary written to `out_dir`."""
    data.load(cfg.data.dataset, cfg.data.data_dir)  # fail fast on missing data, before Ray starts
    recorder = RunRecorder(out_dir, cfg.to_mapping())
    from edgesched.flower.run import RunResult, run_on_grid

    results: list[RunResult] = []
    started = time.monotonic()
    with RoundProgress(cfg.rounds) as progress:

        def on_round(record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
            recorder.on_round(record, jobs, model)
            progress.on_round(record, jobs)

        def main(grid: Grid, context: Context) -> None:
            results.append(run_on_grid(grid, cfg, on_round))

        run_engine(main, cfg, num_nodes=cfg.data.clients)
    if not results:
        raise EdgeschedError(f"the simulation ended without a result; see {out_dir} for the rounds it finished")
    extra = {"seconds": round(time.monotonic() - started, 2), "dataset": cfg.data.dataset, "clients": cfg.data.clients,
             "strategy": cfg.strategy, **model_size(cfg.data.dataset)}
    if cfg.strategy == "edgesched":
        recorder.write_decisions(results[0].decisions)
        extra["prediction_error"] = prediction_error(results[0].decisions, after_round=5)
    return recorder.finish(results[0].weights, extra)


def run_engine(main: Callable[[Grid, Context], None], cfg: RunConfig, num_nodes: int) -> None:
    """Run a ServerApp main function against `num_nodes` simulated nodes."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from edgesched.clients.app import app as client_app

    _quiet_engine()  # after importing Flower, which sets its logger's level on import
    server = ServerApp()
    server.main()(main)
    run_simulation(server_app=server, client_app=client_app, num_supernodes=num_nodes,
                   backend_config=_backend_config(cfg))


def workers(cfg: RunConfig) -> int:
    """Parallel training workers: the machine's cores divided by the cores each client gets."""
    return max(1, int((os.cpu_count() or 1) / cfg.client_cpus))


def _backend_config(cfg: RunConfig) -> dict[str, Any]:
    return {
        "client_resources": {"num_cpus": cfg.client_cpus, "num_gpus": 0.0},
        "init_args": {
            "num_cpus": os.cpu_count() or 1,
            "logging_level": "ERROR",
            "log_to_driver": False,
            "include_dashboard": False,
        },
    }


def _quiet_engine() -> None:
    """Keep Flower's and Ray's chatter (and telemetry) out of the user's terminal."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    warnings.filterwarnings("ignore", module="ray")
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.getLogger("ray").setLevel(logging.ERROR)
