"""The ServerApp. `app` reads Flower's run config (deployment: `flwr run`).

The run itself is edgesched.flower.run: the engine over Flower's nodes in real time, with the
fleet's MQTT telemetry (server.telemetry) and, with `checkpoint-dir`, a checkpoint after every
step that a restarted gateway goes on from (server.checkpoint). With a run directory and
telemetry, the fleet as it was seen is kept there as a trace (trace.csv, edgesched.trace),
rewritten after every step, for the simulator to replay.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from edgesched.config import RunConfig
from edgesched.core.records import JobRecord, Model, RoundCallback, RoundRecord
from edgesched.errors import EdgeschedError
from edgesched.flower.run import RunResult, Saved, check_strategy, run_on_grid
from edgesched.mqtt import RegistryListener
from edgesched.rundir import RunRecorder
from edgesched.server import checkpoint
from edgesched.server.telemetry import DropReport, open_telemetry
from edgesched.trace import TraceRecorder

TRACE_FILE = "trace.csv"

log = logging.getLogger(__name__)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    _log_progress()
    cfg = RunConfig.from_mapping(context.run_config)
    check_strategy(cfg)
    saved = checkpoint.saved_run(cfg)
    recorder = None
    if cfg.out_dir:  # a restarted run continues its run directory from its checkpoint
        resume = saved.logs if saved else None
        recorder = RunRecorder(Path(cfg.out_dir), cfg.to_mapping(), resume, saved.state.history if resume else None)

    with open_telemetry(cfg.telemetry) as telemetry:
        drops = DropReport(telemetry)

        def on_round(record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
            log.info("round %d: accuracy %.4f, loss %.4f, %d sent, %d updates in", record.round, record.accuracy,
                     record.loss, record.selected, record.replied)
            drops.after_round(record.round)
            if recorder is not None:
                recorder.on_round(record, jobs, model)

        trace = None
        if recorder is not None and telemetry is not None:
            from edgesched.tasks import model_size

            trace = TraceRecorder(model_size(cfg.data.dataset)["model_macs_per_sample"])
        result = run_gateway(grid, cfg, on_round, telemetry, recorder, trace)
        if recorder is not None and trace is not None:
            trace.write(recorder.out_dir / TRACE_FILE, time.time())
        totals = drops.totals()
    stopped = {"stopped": result.stopped} if result.stopped else {}
    if recorder is not None:
        recorder.write_decisions(result.decisions)
        recorder.finish(result.weights, {"dataset": cfg.data.dataset, "clients": cfg.data.clients,
                                         "strategy": cfg.strategy, **result.traffic, **totals, **stopped})
        log.info("results in %s", cfg.out_dir)
    if result.stopped:  # the model and logs are written; Flower marks the run failed, with the reason
        raise EdgeschedError(f"the run stopped after round {len(result.rounds)} of {cfg.rounds}: {result.stopped}")


def _log_progress() -> None:
    """edgesched's lines (a round's accuracy, refused updates, quarantines) to stdout, which Flower
    mirrors into the run's log stream: they reach `flwr run --stream` and the gateway's journal.
    Without a handler of its own, Python would show only warnings."""
    logger = logging.getLogger("edgesched")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def run_gateway(grid: Grid, cfg: RunConfig, on_round: RoundCallback, telemetry: RegistryListener | None = None,
                recorder: RunRecorder | None = None, trace: TraceRecorder | None = None) -> RunResult:
    """The run on the gateway: from its checkpoint if a previous start of it left one, writing one
    after every step with `checkpoint-dir` (with the run directory's log sizes, from `recorder`),
    and the step's decisions, the fleet's state (fleet.json) and its `trace` into the run directory."""
    saved = checkpoint.saved_run(cfg)

    def after_step(state: Saved) -> None:
        if recorder is not None:  # decisions.jsonl grows as the run goes
            recorder.add_decisions(state.policy.log)
        if trace is not None and recorder is not None:
            trace.write(recorder.out_dir / TRACE_FILE, time.time())
        if cfg.checkpoint_dir:
            checkpoint.save(cfg, state, recorder.offsets() if recorder else None)

    resume = Saved(saved.state, saved.policy, saved.fleet) if saved else None
    result = run_on_grid(grid, cfg, on_round, telemetry, resume,
                         after_step if cfg.checkpoint_dir or recorder is not None else None,
                         recorder.write_fleet if recorder is not None else None, identify=True, trace=trace)
    if result.stopped is None:  # a stopped run keeps it: started again, it goes on once devices are back
        checkpoint.remove(cfg)
    return result
