"""The ServerApp. `app` reads Flower's run config (deployment: `flwr run`); the simulation
builds its own with `make_server_app`, passing the config and callbacks for its results."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from edgesched.config import GATEWAY_STRATEGIES, RunConfig
from edgesched.errors import ConfigError
from edgesched.results import JobRecord, Model, RoundCallback, RoundRecord, RunRecorder
from edgesched.server.federation import FederationResult, run_federation
from edgesched.server.gateway import run_adaptive, saved_run
from edgesched.server.telemetry import open_telemetry

log = logging.getLogger(__name__)


def _log_round(record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
    log.info("round %d: accuracy %.4f, loss %.4f, %d sent, %d updates in", record.round,
             record.accuracy, record.loss, record.selected, record.replied)


def make_server_app(
    config: RunConfig | None = None,
    on_round: RoundCallback = _log_round,
    on_done: Callable[[FederationResult], None] | None = None,
) -> ServerApp:
    """A ServerApp running `config` (or the run config Flower passes, when `None`)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = config or RunConfig.from_mapping(context.run_config).resolved()
        if cfg.strategy not in GATEWAY_STRATEGIES:
            raise ConfigError(f"strategy {cfg.strategy!r} is a baseline of the fleet simulator (edgesched "
                              f"simulate --fleet); a gateway runs {' or '.join(GATEWAY_STRATEGIES)}")
        saved = saved_run(cfg) if cfg.strategy == "edgesched" else None
        recorder = None
        if cfg.out_dir:  # a restarted run continues its run directory from its checkpoint
            resume = saved.logs if saved else None
            recorder = RunRecorder(Path(cfg.out_dir), cfg.to_mapping(), resume, saved.loop.history if resume else None)

        def record(rnd: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
            on_round(rnd, jobs, model)
            if recorder is not None:
                recorder.on_round(rnd, jobs, model)

        with open_telemetry(cfg) as telemetry:
            if cfg.strategy == "edgesched":
                result = run_adaptive(grid, cfg, record, telemetry, recorder and recorder.offsets, saved)
            else:
                result = run_federation(grid, cfg, record, telemetry)
        if recorder is not None:
            recorder.write_decisions(result.decisions)
            recorder.finish(result.weights, {"dataset": cfg.dataset, "clients": cfg.clients, "strategy": cfg.strategy})
            log.info("results in %s", cfg.out_dir)
        if on_done is not None:
            on_done(result)

    return app


app = make_server_app()
