"""Run a virtual fleet: real training, virtual time, any strategy (simulations/contenders.py).

Flower's own strategies sample from the devices online at the current virtual time and wait
for each round's replies up to the round timeout in virtual seconds; the policies on
edgesched's engine read the registry the devices' heartbeats feed, and the adaptive scheduler
writes decisions.jsonl and decisions.png.

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

from edgesched import partition
from edgesched.core.engine import Engine, EngineState
from edgesched.core.records import JobRecord, Model, RoundRecord
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.errors import EdgeschedError
from edgesched.files import open_log
from edgesched.observe import fleet_record
from edgesched.plots import plot_accuracy, plot_timeline
from edgesched.rundir import RunRecorder
from edgesched.simulations import checkpoint
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.checkpoint import Checkpoint
from edgesched.simulations.clock import EventLog, VirtualClock
from edgesched.simulations.contenders import FLOWER, evaluator, make_policy, run_flower, summary_extra
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.engine import join_cluster, run_engine, workers
from edgesched.simulations.fleet import FleetSpec
from edgesched.simulations.grid_face import FlowerGridFace
from edgesched.simulations.heartbeats import Bus, InProcessBus, MqttBus, RegistryFleetView, VirtualTelemetry
from edgesched.simulations.in_process import run_in_process
from edgesched.simulations.progress import RoundProgress
from edgesched.simulations.transport import Executors, VirtualTransport
from edgesched.tasks import load_data, model_size

IN_PROCESS = "in-process"
CHECKPOINT_SHARE = 0.1  # a slow checkpoint is written after a step while they have taken at most this share of the run
CHECKPOINT_SLOW_S = 1.0  # one that took less is written after every step, whatever the share


def simulate_fleet(spec: FleetSpec, out_dir: Path, broker: str = IN_PROCESS,
                   resume: Checkpoint | None = None, engine: str = "ray", ray_address: str | None = None
                   ) -> dict[str, Any]:
    """Run the fleet with `spec.run.strategy`; telemetry over `broker` (in-process, embedded or a URL);
    the real training on Flower's simulation `engine` ("ray": here, or on the Ray cluster at
    `ray_address`) or in this process ("in-process").

    The adaptive scheduler's strategies write a checkpoint after every round; `resume` (one of
    them, with its own spec and broker) continues that run in `out_dir`.
    """
    cfg = spec.run
    strategy = cfg.strategy
    dataset = load_data(cfg.data.dataset, cfg.data.data_dir)  # fail fast on missing data, before Ray starts
    nodes = workers(cfg, join_cluster(ray_address) if ray_address else None)  # the CLI allows it with ray only
    sizes = [len(p) for p in partition.partition(dataset.y_train, dataset.groups, cfg.data.partitioner,
                                                 spec.size, cfg.data.alpha, cfg.seed)]
    size = model_size(cfg.data.dataset)
    config = {**cfg.to_mapping(), "fleet": spec.name, "fleet-file": str(spec.path), "strategy": strategy,
              "dropout": spec.dynamics.dropout, "target-accuracy": spec.target_accuracy, "telemetry": broker}
    state: dict[str, Any] = {}
    resumed_after = resume.state.step if resume else None  # the engine's state moves on as the run goes
    cost = {"checkpoint_seconds": 0.0, "checkpoint_bytes": 0, "last_seconds": 0.0}  # what writing checkpoints took
    if resume is None:
        fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
        registry = DeviceRegistry(RegistryConfig(fleet=spec.name, heartbeat_interval=spec.dynamics.heartbeat_s))
    else:
        fleet, registry = resume.fleet, resume.telemetry.registry
    with _bus(broker, spec.name) as bus:  # a broker that cannot be reached fails before anything is written
        recorder = RunRecorder(out_dir, config, resume and resume.logs, resume and resume.state.history)
        started = time.monotonic()
        if resume is None:
            telemetry = VirtualTelemetry(fleet, registry, bus)
        else:
            telemetry = resume.telemetry
            telemetry.bus = bus
        events_at = resume.logs["events.jsonl"] if resume else None
        with open_log(out_dir / "events.jsonl", events_at) as events, \
                RoundProgress(cfg.rounds, done=resumed_after or 0, time_budget=cfg.time_budget,
                              starting="training in this process" if engine == "in-process"
                              else "starting the simulation engine") as progress:

            def main(grid: Any, context: Any) -> None:
                weights, evaluate = evaluator(cfg)
                executors = Executors(grid, nodes)
                if resume is None:
                    clock = VirtualClock(fleet, telemetry, EventLog(events))
                    clock.start()
                else:
                    clock = resume.clock
                    clock.log = EventLog(events)
                transport = VirtualTransport(fleet, cfg, sizes, clock, executors, list(weights))
                if resume is not None:
                    transport.restore(resume.transport)
                state["transport"] = transport

                def fleet_now(step: int) -> dict[str, Any]:
                    now = clock.now()
                    busy = {d.device_id for d in fleet.devices if d.busy_until > now}
                    return fleet_record(registry.snapshot(now), busy, now, step,
                                        traffic={"down": transport.bytes_down, "up": transport.bytes_up})

                def on_round(record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
                    recorder.on_round(record, jobs, model)
                    progress.on_round(record, jobs)
                    if strategy in FLOWER:  # the engine's runs write it as they watch
                        recorder.write_fleet(lambda: fleet_now(record.round))

                if strategy in FLOWER:
                    face = FlowerGridFace(transport, grid, cfg.clients_per_round, cfg.seed)
                    state["weights"], state["extra"] = run_flower(face, cfg, weights, evaluate, on_round), {}
                    transport.finish()
                    return
                policy = resume.policy if resume else make_policy(cfg, fleet, sizes, clock)
                run = resume.state if resume else EngineState.start(weights)

                def save_checkpoint(at: EngineState) -> None:
                    begun = time.perf_counter()
                    telemetry.sync()
                    events.flush()
                    recorder.add_decisions(policy.log)  # decisions.jsonl grows as the run goes
                    if (cost["last_seconds"] > CHECKPOINT_SLOW_S
                            and cost["checkpoint_seconds"] > CHECKPOINT_SHARE * (time.monotonic() - started)):
                        return  # a large fleet's checkpoint (seconds to write): not after every step
                    logs = {**recorder.offsets(), "events.jsonl": events.tell()}
                    checkpoint.save(out_dir, Checkpoint(spec, broker, at, policy, clock, transport.snapshot(), fleet,
                                                        telemetry, logs))
                    cost["last_seconds"] = time.perf_counter() - begun
                    cost["checkpoint_seconds"] += cost["last_seconds"]
                    cost["checkpoint_bytes"] = (out_dir / checkpoint.FILE).stat().st_size

                engine_ = Engine(policy, transport, clock, RegistryFleetView(telemetry, sizes), evaluate, on_round,
                                 lambda: time.monotonic() - started, save_checkpoint,
                                 lambda at, settled: recorder.write_fleet(lambda: fleet_now(at.step), settled))
                try:
                    engine_.run(run, cfg.rounds, cfg.time_budget)
                finally:
                    recorder.write_decisions(policy.log)
                state["weights"], state["extra"] = run.weights(), summary_extra(cfg, policy, fleet, sizes)
                transport.finish()

            if engine == "in-process":
                run_in_process(main, num_nodes=nodes, threads=max(1, int(cfg.client_cpus)))
            else:
                run_engine(main, cfg, num_nodes=nodes)
    if "weights" not in state:
        raise EdgeschedError(f"the simulation ended without a result; see {out_dir} for the rounds it finished")
    reached = next((r.virtual_seconds for r in recorder.rounds if r.accuracy >= spec.target_accuracy), None)
    summary = recorder.finish(state["weights"], {
        "seconds": round(time.monotonic() - started, 2), "dataset": cfg.data.dataset, "clients": spec.size,
        "fleet": spec.name, "strategy": strategy,
        "virtual_seconds": recorder.rounds[-1].virtual_seconds if recorder.rounds else 0.0,
        "target_accuracy": spec.target_accuracy, "time_to_target_s": reached, "time_budget_s": cfg.time_budget,
        "device_seconds": round(state["transport"].device_seconds, 3),
        "bytes_down": state["transport"].bytes_down, "bytes_up": state["transport"].bytes_up,
        "telemetry_dropped": dict(registry.dropped), **state.get("extra", {}), **size,
        **({"resumed_after_round": resumed_after} if resume else {}),
        **({"checkpoint_seconds": round(cost["checkpoint_seconds"], 3),
            "last_checkpoint_bytes": cost["checkpoint_bytes"]} if strategy not in FLOWER else {}),
    })
    (out_dir / checkpoint.FILE).unlink(missing_ok=True)  # the run is complete: summary.json says so
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
