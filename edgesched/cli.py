"""The `edgesched` command line.

Heavy imports (torch, Flower, Ray) happen inside the commands that need them, so
`edgesched --help` is instant and the device agent never loads them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from edgesched.config import (
    ABLATIONS,
    BASELINES,
    DATASETS,
    ENGINES,
    GATEWAY_STRATEGIES,
    STRATEGIES,
    RunConfig,
    parse_scheduler_keys,
)
from edgesched.errors import ConfigError, EdgeschedError

if TYPE_CHECKING:
    from edgesched.simulations.fleet import FleetSpec

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Federated training for fleets of edge devices, scheduled from their live resources.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_DEFAULTS = RunConfig()


@app.callback()
def _group() -> None:
    """Federated training for fleets of edge devices, scheduled from their live resources."""


Opt = typer.Option


@app.command()
def simulate(
    dataset: Annotated[str, Opt(help="fmnist (Fashion-MNIST), hapt (UCI HAPT, 30 users) or digits (quick).")] = (
        _DEFAULTS.data.dataset
    ),
    data_dir: Annotated[Path | None, Opt(help=(
        "Folder with the data set's files. Default for fmnist: /usr/share/datasets/fashion-mnist; "
        "hapt needs the folder holding hapt_raw_by_user.npz."
    ))] = None,
    clients: Annotated[int | None, Opt(help=(
        "Virtual clients. Default: 10 for fmnist and digits; 30 for hapt, one per user."
    ))] = None,
    time_budget: Annotated[float | None, Opt(help=(
        "Seconds the run may take (virtual seconds with --fleet): no server step starts after them. --rounds then "
        "caps the steps. Default: the fleet file's time_budget_s, else none."
    ))] = None,
    rounds: Annotated[int | None, Opt(help=(
        f"Federated rounds. Default: {_DEFAULTS.rounds}, or the fleet file's."
    ))] = None,
    seed: Annotated[int | None, Opt(help=(
        f"Seed for the split, sampling, initial weights and the fleet's dynamics. Default: {_DEFAULTS.seed}, "
        "or the fleet file's."
    ))] = None,
    out: Annotated[Path | None, Opt(help="Run directory. Default: runs/DATASET-DATE-TIME.")] = None,
    partitioner: Annotated[str | None, Opt(help=(
        "iid, dirichlet (label skew), dirichlet-balanced (label skew, equal sizes), natural (by user) or "
        "sampled (IID, shared when there are more clients than samples). "
        "Default: natural for hapt, dirichlet otherwise."
    ))] = None,
    alpha: Annotated[float, Opt(help="Dirichlet concentration: smaller is more skewed.")] = _DEFAULTS.data.alpha,
    fraction_train: Annotated[float, Opt(help="Share of clients that train each round.")] = _DEFAULTS.fraction_train,
    local_epochs: Annotated[int | None, Opt(help=(
        "Local epochs per job. Default: 1 for fmnist; 5 for hapt and digits, whose clients hold little data."
    ))] = None,
    batch_size: Annotated[int, Opt(help="Local mini-batch size.")] = _DEFAULTS.training.batch_size,
    lr: Annotated[float, Opt(help="Local SGD learning rate (momentum 0.9).")] = _DEFAULTS.training.lr,
    client_cpus: Annotated[float, Opt(help=(
        "CPU cores per simulated client; cores / this = parallel workers."
    ))] = _DEFAULTS.client_cpus,
    fleet: Annotated[str | None, Opt(help=(
        "A fleet file (TOML) or the name of a shipped one (mixed-24, lab-20, campus-100, phones-1000, replay; "
        "hapt-30 with --data-dir): virtual devices "
        "calibrated on real boards and phones, trained for real, timed in virtual seconds. The file sets the "
        "data and training options; --seed, --rounds, --data-dir and --dropout override it."
    ))] = None,
    trace: Annotated[Path | None, Opt(help=(
        "Replay a fleet's trace (CSV: when each device was online and how fast it trained; a gateway writes "
        "one into its run directory as trace.csv; docs/traces.md): its devices replace --fleet's, or, without "
        "--fleet, train on the shipped replay fleet's data and settings."
    ))] = None,
    strategy: Annotated[str | None, Opt(help=(
        "edgesched (the adaptive scheduler: per-device work, epochs and staleness bound from predicted speed "
        "and dropout risk; semi-asynchronous aggregation; docs/scheduler.md) or fedavg (Flower's FedAvg, "
        "synchronous rounds). Default: edgesched with --fleet; fedavg for a plain run, whose identical "
        "clients leave nothing to schedule. With --fleet also the baselines fedprox, deadline (FedAvg, fixed "
        "deadline, 130 % over-selection), fedbuff, oracle (knows the future) and the ablations "
        f"{', '.join(ABLATIONS)} (docs/benchmarks.md)."
    ))] = None,
    scheduler: Annotated[str | None, Opt(help=(
        "Change the adaptive scheduler's settings, as flwr run's --run-config does on a gateway: "
        "\"min-round-share=1.0 max-staleness=2\". Keys, defaults and meaning: docs/scheduler.md."
    ))] = None,
    broker: Annotated[str | None, Opt(help=(
        "With --fleet: carry the virtual devices' heartbeats over MQTT instead of in-process: 'embedded' "
        "(a broker on loopback) or mqtt://host:port. Decisions come out the same either way."
    ))] = None,
    dropout: Annotated[float | None, Opt(help=(
        "With --fleet: probability that a device drops out during a job (overrides the file)."
    ))] = None,
    bad_updates: Annotated[float | None, Opt(help=(
        "With --fleet: probability that a delivered update is corrupt — NaN, or 100x too large — as from a "
        "board with failing memory or a broken client build (overrides the file)."
    ))] = None,
    malicious: Annotated[float | None, Opt(help=(
        "With --fleet: share of the devices that are hostile (drawn from the seed): every update they deliver "
        "is an --attack (overrides the file)."
    ))] = None,
    attack: Annotated[str | None, Opt(help=(
        "With --fleet: what hostile devices do: sign-flip (the change they trained, reversed), scale (100x), "
        "nan, lie-steps or lie-examples (honest weights, a billion claimed). Default sign-flip."
    ))] = None,
    onnx_every_round: Annotated[bool, Opt("--onnx-every-round", help=(
        "Also write each round's global model as RUN_DIR/onnx/round-NNNN.onnx, for boards that only infer "
        "(needs onnx: pip install 'edgesched[onnx]'). `edgesched export --onnx` writes the final one."
    ))] = False,
    engine: Annotated[str, Opt(help=(
        "With --fleet: where the real training runs. ray (Flower's simulation engine, every core) or "
        "in-process (one core, no 10-20 s engine start, plain tracebacks: short runs and debugging). "
        "Results are byte-identical either way."
    ))] = "ray",
    dashboard: Annotated[bool, Opt("--dashboard", help=(
        "Watch the run in a browser while it goes: the fleet, accuracy against time, who trained when, the "
        "scheduler's decisions, and Prometheus metrics at /metrics (needs pip install 'edgesched[dashboard]'). "
        "Served on loopback; `edgesched dashboard RUN_DIR` replays a finished run."))] = False,
    dashboard_port: Annotated[int, Opt(help="Port for --dashboard (another free one if it is taken).")] = 8765,
    compare: Annotated[str | None, Opt(help=(
        "With --fleet: then run the same fleet under this strategy (e.g. fedavg, fedbuff) into a run "
        "directory beside RUN_DIR named for it, and draw both runs' accuracy against virtual time in "
        "RUN_DIR/compare.png."))] = None,
    ray_address: Annotated[str | None, Opt(envvar="RAY_ADDRESS", help=(
        "Train on an existing Ray cluster at this address (host:port of `ray start --head`) instead of starting "
        "Ray on this machine; the executors spread over its nodes and a seed gives the same run (README, "
        "\"On a Ray cluster\"). Default: $RAY_ADDRESS."))] = None,
    resume: Annotated[Path | None, Opt(help=(
        "Continue a stopped fleet run (killed, crashed, the machine rebooted) from its run directory, with "
        "its own settings: the adaptive scheduler's strategies checkpoint after every round, and the resumed "
        "run ends exactly as an uninterrupted one would (docs/reliability.md)."
    ))] = None,
) -> None:
    """Simulate a federation on this machine and write a run directory.

    Clients train for real on their share of the data (Flower's simulation engine, Ray);
    the global model is evaluated on the held-out test set after every round.

    The run directory holds config.json (what ran), rounds.csv (test accuracy and loss per
    round), jobs.csv (each client job: samples, steps, seconds, samples/s), summary.json,
    model.npz (the final global weights) and accuracy.png; with --onnx-every-round, also onnx/.
    """
    if not 0 < dashboard_port < 65536:
        raise ConfigError(f"--dashboard-port {dashboard_port}: expected 1-65535")
    if ray_address and engine != "ray":
        raise ConfigError("--ray-address runs the training on a Ray cluster: it needs --engine ray")
    if resume is not None:
        given = [f"--{name.replace('_', '-')}" for name in click.get_current_context().params
                 if name not in ("resume", "engine") and click.get_current_context().get_parameter_source(name)
                 == click.core.ParameterSource.COMMANDLINE]
        if given and set(given) - {"--dashboard", "--dashboard-port", "--ray-address"}:
            raise ConfigError(f"--resume continues the run with its own settings; drop {', '.join(given)}")
        with _dashboard(resume, dashboard, dashboard_port):
            _resume_fleet(resume, engine, ray_address)
        return
    if engine not in ENGINES:
        raise ConfigError(f"--engine: unknown {engine!r}; choose one of {', '.join(ENGINES)}")
    scheduler_keys = parse_scheduler_keys(scheduler or "")
    if trace is not None and fleet is None:
        fleet = "replay"
    chosen = strategy or ("edgesched" if fleet is not None else "fedavg")  # the default: edgesched on a fleet
    if scheduler_keys and chosen in BASELINES:
        raise ConfigError(f"--scheduler sets the adaptive scheduler, which --strategy {chosen} does not use; "
                          "pick an edgesched strategy or drop --scheduler")
    if fleet is not None:
        from edgesched.simulations.fleet import load_fleet

        spec = load_fleet(fleet).with_overrides(
            seed=seed, rounds=rounds, dropout=dropout, data_dir=str(data_dir) if data_dir else None,
            strategy=chosen, bad_updates=bad_updates, malicious=malicious, attack=attack,
            onnx_every_round=onnx_every_round,
            scheduler=scheduler_keys, time_budget=time_budget, trace=str(trace) if trace else None)
        if compare is not None and compare not in STRATEGIES:
            raise ConfigError(f"--compare: unknown strategy {compare!r}; choose one of {', '.join(STRATEGIES)}")
        _simulate_fleet(spec, broker, out, engine, dashboard, dashboard_port, compare, ray_address)
        return
    if any(v is not None for v in (dropout, broker, bad_updates, malicious, attack, compare)) or engine != "ray":
        raise ConfigError("--dropout, --bad-updates, --malicious, --attack, --broker, --compare and --engine need "
                          "--fleet: they describe a virtual fleet")
    if chosen in STRATEGIES and chosen not in GATEWAY_STRATEGIES:
        raise ConfigError(f"--strategy {chosen} is a baseline for virtual fleets: it needs --fleet")
    cfg = RunConfig.from_mapping({
        "dataset": dataset, "data-dir": str(data_dir) if data_dir else None, "clients": clients,
        "partitioner": partitioner, "alpha": alpha, "fraction-train": fraction_train, "local-epochs": local_epochs,
        "batch-size": batch_size, "lr": lr, "client-cpus": client_cpus, "broker": "none", "strategy": chosen,
        "onnx-every-round": onnx_every_round, "rounds": rounds, "seed": seed, "time-budget": time_budget,
        **scheduler_keys})
    out_dir = out or Path("runs") / f"{cfg.data.dataset}-{datetime.now():%Y%m%d-%H%M%S}"
    from edgesched.simulations.engine import simulate as run

    with _dashboard(out_dir, dashboard, dashboard_port):
        summary = run(cfg, out_dir, ray_address)
    typer.echo(
        f"final accuracy {summary['final_accuracy']:.2%} after {summary['rounds']} rounds "
        f"in {summary['seconds']:.0f} s; results in {out_dir}"
    )


def _simulate_fleet(spec: FleetSpec, broker: str | None, out: Path | None, engine: str, dashboard: bool = False,
                    port: int = 8765, compare: str | None = None, ray_address: str | None = None) -> None:
    from edgesched.simulations.fleet_run import IN_PROCESS, simulate_fleet

    out_dir = out or Path("runs") / f"{spec.name}-{spec.run.strategy}-{datetime.now():%Y%m%d-%H%M%S}"
    with _dashboard(out_dir, dashboard, port):
        summary = simulate_fleet(spec, out_dir, broker or IN_PROCESS, engine=engine, ray_address=ray_address)
    _report(spec, out_dir, summary)
    if compare is None:
        return
    from edgesched.simulations.compare import compare_runs

    mine = f"-{spec.run.strategy}-"  # runs/FLEET-STRATEGY-DATE names its twin runs/FLEET-OTHER-DATE
    other = out_dir.with_name(out_dir.name.replace(mine, f"-{compare}-", 1) if mine in out_dir.name
                              else f"{out_dir.name}-{compare}")
    typer.echo(f"the same fleet under {compare}, for comparison:", err=True)
    other_summary = simulate_fleet(spec.with_overrides(strategy=compare), other, broker or IN_PROCESS, engine=engine,
                                   ray_address=ray_address)
    _report(spec.with_overrides(strategy=compare), other, other_summary)
    typer.echo(compare_runs(spec, [out_dir, other], out_dir / "compare.png"))


@contextmanager
def _dashboard(run_dir: Path, wanted: bool, port: int) -> Iterator[None]:
    """With `wanted`, the run's dashboard is served beside it (edgesched.dashboard.child)."""
    if not wanted:
        yield
        return
    from edgesched.dashboard.child import DashboardProcess, free_port

    _need_dashboard_extra()
    run_dir.mkdir(parents=True, exist_ok=True)
    with DashboardProcess(run_dir, "127.0.0.1", free_port("127.0.0.1", port)) as served:
        typer.echo(f"dashboard: {served.url} (metrics at {served.url}metrics)", err=True)
        yield
    typer.echo(f"the dashboard stopped with the run; replay it: edgesched dashboard {run_dir}", err=True)


def _need_dashboard_extra() -> None:
    import importlib.util

    modules = ("starlette", "uvicorn", "plotly", "prometheus_client")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"the dashboard needs {', '.join(missing)}: pip install 'edgesched[dashboard]'")


def _resume_fleet(run_dir: Path, engine: str, ray_address: str | None = None) -> None:
    from edgesched.simulations import checkpoint
    from edgesched.simulations.fleet_run import simulate_fleet

    saved = checkpoint.load(run_dir)
    typer.echo(f"resuming {run_dir} after round {saved.state.step} of {saved.spec.run.rounds}", err=True)
    _report(saved.spec, run_dir, simulate_fleet(saved.spec, run_dir, saved.broker, resume=saved, engine=engine,
                                                       ray_address=ray_address))


def _report(spec: FleetSpec, out_dir: Path, summary: dict) -> None:
    reached = summary["time_to_target_s"]
    target = f"target {spec.target_accuracy:.0%} reached at {reached:.0f} virtual s" if reached is not None \
        else f"target {spec.target_accuracy:.0%} not reached"
    typer.echo(
        f"final accuracy {summary['final_accuracy']:.2%} after {summary['rounds']} rounds, "
        f"{summary['virtual_seconds']:.0f} virtual s ({summary['seconds']:.0f} s real); {target}; "
        f"results in {out_dir}"
    )


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory (it holds model.npz and config.json).")],
    onnx: Annotated[bool, Opt("--onnx", help="Write the global model as ONNX (the only format so far).")] = False,
    out: Annotated[Path | None, Opt(help="Where to write it. Default: RUN_DIR/model.onnx.")] = None,
) -> None:
    """Export a run's global model for inference: `edgesched export --onnx runs/RUN`.

    The ONNX file (opset 17, dynamic batch, input `x`, output `logits`) runs in onnxruntime on
    boards without torch, and takes raw readings as float32 (Fashion-MNIST: pixels 0-255, 28x28; HAPT:
    the 6 sensor channels x 128 samples; digits: 64 values 0-16): the input normalisation is in the
    graph. It is checked before it is written: evaluated with onnxruntime on the data set's raw
    test inputs, its accuracy must match the torch model's.
    """
    import json

    from edgesched.export import evaluate_onnx, load_weights, to_onnx
    from edgesched.tasks import build_model, load_data
    from edgesched.training import scorer

    if not onnx:
        raise ConfigError("say which format: --onnx")
    for needed in ("config.json", "model.npz"):
        if not (run_dir / needed).is_file():
            raise ConfigError(f"{run_dir}: no {needed}; export needs a finished run directory")
    target = out or run_dir / "model.onnx"
    cannot = f"{'--out ' if out else ''}{target}: cannot write the ONNX file"
    if why := _unwritable(target):  # before the export's seconds of work, not after them
        raise ConfigError(f"{cannot} ({why})")
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except ValueError as exc:  # not JSON, not UTF-8
        raise ConfigError(f"{run_dir / 'config.json'}: not a run's config ({exc})") from None
    dataset = config.get("dataset") if isinstance(config, dict) else None
    if not isinstance(dataset, str):
        raise ConfigError(f"{run_dir / 'config.json'}: not a run's config (dataset {dataset!r})")
    weights = load_weights(run_dir / "model.npz", dataset)
    test = load_data(dataset, config.get("data-dir"))
    model_bytes = to_onnx(dataset, weights)
    torch_loss, torch_acc = scorer(build_model(dataset), test.x_test, test.y_test)(list(weights.values()))
    assert test.x_test_raw is not None
    onnx_loss, onnx_acc = evaluate_onnx(model_bytes, test.x_test_raw, test.y_test)
    if abs(onnx_acc - torch_acc) > 1e-4 or abs(onnx_loss - torch_loss) > 1e-4 * max(1.0, torch_loss):
        raise EdgeschedError(f"the ONNX export scores {onnx_acc:.4%} / loss {onnx_loss:.5f} where torch scores "
                             f"{torch_acc:.4%} / {torch_loss:.5f}; not written")
    try:
        target.write_bytes(model_bytes)
    except OSError as exc:  # what _unwritable cannot see: /proc, a full disk
        raise ConfigError(f"{cannot} ({exc.strerror or exc})") from None
    typer.echo(f"wrote {target} ({len(model_bytes) / 1e6:.2f} MB); onnxruntime test accuracy {onnx_acc:.2%}, "
               f"same as torch")


def _unwritable(target: Path) -> str | None:
    """Why no file can be written at `target`, as far as looking shows (it is a directory; its
    folder is missing, a file or read-only), else None."""
    folder = target.parent
    return ("Is a directory" if target.is_dir() else
            "No such directory" if not folder.exists() else
            "Not a directory" if not folder.is_dir() else
            "Permission denied" if not os.access(folder, os.W_OK) else None)


@app.command(name="dashboard")
def dashboard_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory: a gateway's, a running simulation's or a finished "
                                                 "one.")],
    host: Annotated[str, Opt(help="Address to serve on. Loopback by default: to show it further, put it behind the "
                                  "gateway's TLS proxy (docs/dashboard.md).")] = "127.0.0.1",
    port: Annotated[int, Opt(help="Port to serve on.")] = 8765,
) -> None:
    """Serve a run's dashboard: its fleet, accuracy against time, who trained when, the scheduler's
    decisions and telemetry drops, live while the run goes (or replayed from a finished run's
    files), with Prometheus metrics at /metrics. Read-only."""
    _need_dashboard_extra()
    from edgesched.dashboard.server import serve

    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: expected 1-65535")
    serve(run_dir, host, port)


@app.command()
def status(
    run_dir: Annotated[Path, typer.Argument(help="A run directory: a gateway's, a running simulation's or a finished "
                                                 "one.")],
    devices: Annotated[int, Opt(help="Device rows to show, busiest first (0: none).")] = 20,
) -> None:
    """Print where a run stands: its step and accuracy, devices by state, jobs, telemetry, and
    its devices (what `edgesched dashboard` shows, in the terminal)."""
    from edgesched.status import status as show

    show(run_dir, devices)


@app.command()
def agent(
    broker: Annotated[str, Opt(help="The gateway's broker: mqtt://host:port, or mqtts://host:port for TLS.")],
    device_id: Annotated[str, Opt(help="This device's id (letters, digits, _ . -); the same as its SuperNode's "
                                      "node config device-id.")],
    fleet: Annotated[str, Opt(help="Fleet name: the topic level that separates fleets on one broker.")] = "default",
    interval: Annotated[float, Opt(help="Seconds between heartbeats.")] = 5.0,
    keepalive: Annotated[int, Opt(help="MQTT keepalive in seconds: the broker declares this device offline "
                                       "1.5 x keepalive after it goes silent.")] = 30,
    ca_file: Annotated[Path | None, Opt(help="CA certificate that signed the broker's (mqtts:// only).")] = None,
    username: Annotated[str | None, Opt(help="MQTT user name (usually the device id).")] = None,
    password: Annotated[str | None, Opt(help="MQTT password; better set EDGESCHED_MQTT_PASSWORD, which other "
                                             "users cannot see in the process list.")] = None,
    speed_test: Annotated[str | None, Opt(help=(
        "Data set (fmnist, hapt, digits) whose model to time with onnxruntime for about a second at start-up; "
        "the speed is published with the capabilities, so the gateway has an estimate for this board's first "
        "job of a run on that data set. Needs torch, onnx and onnxruntime."))] = None,
    cgroup: Annotated[Path | None, Opt(help=(
        "Report the CPU load of this cgroup (v2: its folder; v1: its folder under the cpu controller) as a share "
        "of its CPU quota, not the whole machine's: for a board whose training runs in a CPU-limited container "
        "or unit."))] = None,
) -> None:
    """Publish this device's resources to the gateway over MQTT until stopped.

    Heartbeats carry CPU load and frequency, memory, temperature and throttling, battery,
    link type and round-trip time, and the last training job's speed (which the ClientApp
    leaves in a local file). Status "online" and capabilities are retained; "offline" is
    the Last Will. SIGTERM publishes "offline" and exits 0. Needs neither torch nor Flower.
    """
    import logging

    from edgesched.clients.agent import AgentConfig, run_agent
    from edgesched.core.telemetry import valid_id
    from edgesched.mqtt import BrokerURL

    for name, value in (("--device-id", device_id), ("--fleet", fleet)):
        if not valid_id(value):
            raise ConfigError(f"{name} {value!r}: use 1-64 letters, digits, '_', '.' or '-'")
    if interval <= 0 or keepalive < 1:
        raise ConfigError("--interval must be > 0 and --keepalive >= 1")
    if speed_test is not None and speed_test not in DATASETS:
        raise ConfigError(f"--speed-test {speed_test!r}: choose one of {', '.join(DATASETS)}")
    if cgroup is not None:
        from edgesched.clients.probes import CgroupCpu

        try:
            CgroupCpu(cgroup)
        except (OSError, ValueError, IndexError, StopIteration) as exc:
            raise ConfigError(f"--cgroup {cgroup}: not a readable cgroup ({exc})") from None
    url = BrokerURL.parse(broker, username, password)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = AgentConfig(url, device_id, fleet, interval, keepalive, str(ca_file) if ca_file else None,
                         str(cgroup) if cgroup else None)
    run_agent(config, speed_test)


@app.command()
def gate(
    certfile: Annotated[Path, Opt(help="The gateway's TLS certificate, the one the boards' CA signed.")],
    keyfile: Annotated[Path, Opt(help="Its private key.")],
    listen: Annotated[str, Opt(help="host:port the boards dial (their SuperNodes' --superlink).")] = "0.0.0.0:9092",
    superlink: Annotated[str, Opt(help="The SuperLink on this gateway's loopback.")] = "https://127.0.0.1:9093",
    ca_file: Annotated[Path | None, Opt(help="CA that signed the SuperLink's certificate (https:// only).")] = None,
) -> None:
    """Serve the SuperLink's Fleet API to the boards, and nothing else.

    Flower's SuperLink serves the Fleet API, the Control API (flwr run, flwr supernode
    register) and its runtime API on one port. On a gateway it listens on loopback, and this
    gate, on the boards' network, passes on only what SuperNodes send: nobody who can reach
    the boards' port can register a key or start a run (docs/deploy.md)."""
    import logging

    from edgesched.gate import serve

    for name, path in (("--certfile", certfile), ("--keyfile", keyfile), ("--ca-file", ca_file)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{name} {path}: no such file")
    port = listen.rpartition(":")[2]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {listen!r}: expected host:port")
    if not superlink.startswith(("http://", "https://")):
        raise ConfigError(f"--superlink {superlink!r}: expected https://host:port")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(listen, superlink, str(certfile), str(keyfile), str(ca_file) if ca_file else None)


@app.command()
def submit(
    app_dir: Annotated[Path, typer.Argument(metavar="APP", help="The Flower app's folder (its pyproject.toml "
                                                              "names edgesched's apps and the run's settings).")],
    superlink: Annotated[str | None, typer.Argument(help="A SuperLink named in $FLWR_HOME/config.toml "
                                                         "(default: its default one).")] = None,
) -> None:
    """Start a run on the SuperLink and follow its log to the end; stopped (Ctrl-C, SIGTERM), stop
    the run on the SuperLink too.

    `flwr run --stream` leaves the run going when it is stopped; this is what
    `edgesched-run@NAME` runs, so that stopping the unit stops the run. Exits 0 when the run
    completed or was stopped from here, 1 when it failed or was stopped elsewhere."""
    from edgesched.flower.submit import submit as run_app

    run_app(app_dir, superlink)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors become one line on stderr and a non-zero exit code."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="edgesched", standalone_mode=False)
    except EdgeschedError as exc:
        print(f"edgesched: error: {exc}", file=sys.stderr)
        return 1
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        print(f"edgesched: error: {exc.format_message()}{hint}", file=sys.stderr)
        return 2
    except click.ClickException as exc:
        print(f"edgesched: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        print("edgesched: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
