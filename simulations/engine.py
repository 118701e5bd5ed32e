"""Run a federation on Flower's simulation engine (Ray) and write the run directory.

Ray starts one worker per `client-cpus` share of the machine's cores (or of a Ray cluster's,
joined with `join_cluster`); each worker trains whichever partition a message names. Ray's and
Flower's own logging is turned down so the user sees edgesched's progress; client failures are
counted in the results instead.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesched.config import RunConfig
from edgesched.core.decisions import prediction_error
from edgesched.core.records import JobRecord, Model, RoundRecord
from edgesched.errors import EdgeschedError
from edgesched.rundir import RunRecorder
from edgesched.simulations.progress import RoundProgress
from edgesched.tasks import load_data, model_size

if TYPE_CHECKING:
    from flwr.app import Context
    from flwr.serverapp import Grid


def simulate(cfg: RunConfig, out_dir: Path, ray_address: str | None = None) -> dict[str, Any]:
    """Run `cfg` (already resolved) here, or on the Ray cluster at `ray_address`, and return the
    summary written to `out_dir`."""
    load_data(cfg.data.dataset, cfg.data.data_dir)  # fail fast on missing data, before Ray starts
    if ray_address:
        join_cluster(ray_address)
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


def workers(cfg: RunConfig, cpus: int | None = None) -> int:
    """Parallel training workers: the cores (this machine's, or a cluster's `cpus`) divided by the
    cores each client gets."""
    return max(1, int((cpus or os.cpu_count() or 1) / cfg.client_cpus))


def join_cluster(address: str) -> int:
    """Join the Ray cluster at `address` (`ray start --head` on one machine, `ray start --address`
    on the others) before Flower would start a Ray of its own, which it then does not; the
    cluster's CPUs. The executors are Ray actors and spread over the cluster's nodes; which node
    trains a message changes nothing in the result, so a seed gives the same run as on one machine."""
    import ray

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EdgeschedError(f"--ray-address {address!r}: expected host:port of the cluster's head")
    try:  # Ray itself would retry an absent head for minutes
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise EdgeschedError(f"cannot join the Ray cluster at {address}: {exc.strerror or exc}") from None
    _quiet_engine()
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EdgeschedError(f"cannot join the Ray cluster at {address}: {str(exc).splitlines()[0]}") from None
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if cpus < 1:
        raise EdgeschedError(f"the Ray cluster at {address} has no CPUs to train on")
    return cpus


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
