"""Fleet files: the devices of a virtual fleet, its data, training and dynamics, in TOML.

Every value is checked on load; an error names the file and the key, e.g.
`lab.toml: devices[2].board: unknown 'rpi9'; known: rpi4, rpi5, ...`. A fleet's devices are
[[devices]] groups drawn from the catalog, or the devices of a trace (`trace = "fleet.csv"`,
beside the fleet file; edgesched.trace), replayed as they were recorded.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesched.config import RunConfig
from edgesched.errors import ConfigError
from edgesched.simulations.catalog import Catalog, load_catalog, tomllib
from edgesched.trace import Trace, load_trace

FLEETS = Path(__file__).with_name("fleets")
ALWAYS_ON_S = 1e12


@dataclass(frozen=True)
class DeviceGroup:
    board: str
    count: int
    network: str
    online_s: float = ALWAYS_ON_S  # mean length of an online period (exponential)
    offline_s: float = 0.0  # mean length of an offline period; 0 = never offline


# What a hostile device does with every update it delivers: sends the change it trained reversed
# (sign-flip) or 100x too large (scale), NaN weights (nan), or honest weights with a lie about the
# job: a billion steps (lie-steps) or a billion examples (lie-examples).
ATTACKS = ("sign-flip", "scale", "nan", "lie-steps", "lie-examples")


@dataclass(frozen=True)
class Dynamics:
    dropout: float = 0.0  # probability that a device drops out during a job
    background_load: float = 0.0  # mean extra slowdown of a job from other work (0.2 = 20 % slower)
    availability: bool = True  # devices go offline and come back (per group's periods)
    diurnal: bool = False  # online and charging periods longer at night
    start_hour: float = 9.0  # time of day at virtual time 0 (for the diurnal pattern)
    thermal: bool = True  # boards with a thermal model heat up and throttle
    battery: bool = True  # boards with a battery drain, charge, and go flat
    bandwidth_noise: bool = True  # each transfer draws its bandwidth (off: the link's mean)
    heartbeat_s: float = 60.0  # virtual seconds between a device's heartbeats
    bad_updates: float = 0.0  # probability that a delivered update is corrupt (NaN, or 100x too large)
    malicious: float = 0.0  # share of the devices that are hostile: every update they deliver is an `attack`
    attack: str = "sign-flip"  # one of ATTACKS


@dataclass(frozen=True)
class FleetSpec:
    name: str
    path: Path
    seed: int
    target_accuracy: float
    groups: tuple[DeviceGroup, ...]
    dynamics: Dynamics
    run: RunConfig  # data and training settings; clients = number of devices
    trace: Trace | None = None  # devices replayed from a trace (then there are no groups)

    @property
    def size(self) -> int:
        return len(self.trace.devices) if self.trace else sum(g.count for g in self.groups)

    def with_overrides(self, *, seed: int | None = None, rounds: int | None = None, dropout: float | None = None,
                       data_dir: str | None = None, strategy: str | None = None,
                       bad_updates: float | None = None, malicious: float | None = None,
                       attack: str | None = None, onnx_every_round: bool = False,
                       scheduler: Mapping[str, str] | None = None, time_budget: float | None = None,
                       trace: str | None = None) -> FleetSpec:
        """The same fleet with CLI overrides applied (None keeps the file's value); `scheduler`
        holds kebab-case scheduler settings (`--scheduler`); `trace`: the devices of that trace
        file replace the fleet's (as many per step as the file asks, at most all of them)."""
        base = self
        if trace is not None:
            replayed = load_trace(trace)
            wanted = min(self.run.clients_per_round, len(replayed.devices))
            run = self.run.with_keys({"clients": len(replayed.devices),
                                      "fraction-train": wanted / len(replayed.devices)})
            base = dataclasses.replace(self, groups=(), trace=replayed, run=run)
        given = {"seed": seed, "rounds": rounds, "data-dir": data_dir, "strategy": strategy,
                 "onnx-every-round": onnx_every_round or None, "time-budget": time_budget}
        run = base.run.with_keys({**{k: v for k, v in given.items() if v is not None}, **(scheduler or {})})
        dynamics = dataclasses.replace(
            base.dynamics,
            dropout=base.dynamics.dropout if dropout is None else dropout,
            bad_updates=base.dynamics.bad_updates if bad_updates is None else bad_updates,
            malicious=base.dynamics.malicious if malicious is None else malicious,
            attack=base.dynamics.attack if attack is None else attack,
        )
        for flag, value in (("--dropout", dynamics.dropout), ("--bad-updates", dynamics.bad_updates),
                            ("--malicious", dynamics.malicious)):
            if not 0 <= value <= 1:
                raise ConfigError(f"{flag} must be in [0, 1], got {value}")
        if dynamics.attack not in ATTACKS:
            raise ConfigError(f"--attack: unknown {dynamics.attack!r}; choose one of {', '.join(ATTACKS)}")
        return dataclasses.replace(base, seed=run.seed, run=run, dynamics=dynamics)


def resolve_fleet_path(name: str) -> Path:
    """A path, or the name of a shipped fleet (`lab-20` for simulations/fleets/lab-20.toml)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = FLEETS / f"{name.removesuffix('.toml')}.toml"
    if shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in FLEETS.glob("*.toml")))
    raise ConfigError(f"fleet file {name} not found; shipped fleets: {known}")


def load_fleet(name: str, catalog: Catalog | None = None) -> FleetSpec:
    path = resolve_fleet_path(name)
    catalog = catalog or load_catalog()
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    r = _Reader(path)
    r.only(raw, "", {"name", "description", "seed", "target_accuracy", "data", "training", "dynamics", "devices",
                     "trace"})
    trace_file = r.get(raw, "trace", str, None)
    devices = r.get(raw, "devices", list, [])
    if trace_file is not None and devices:
        raise ConfigError(f"{path}: trace: a fleet's devices come from [[devices]] or a trace, not both")
    trace = load_trace(os.path.normpath(path.parent / trace_file)) if trace_file is not None else None
    if not devices and trace is None:
        raise ConfigError(f"{path}: devices: list at least one [[devices]] group, or name a trace")
    groups = tuple(_group(r, d, f"devices[{i}]", catalog) for i, d in enumerate(devices))
    data = r.get(raw, "data", dict)
    training = r.get(raw, "training", dict)
    dyn = r.get(raw, "dynamics", dict, {})
    r.only(data, "data.", {"dataset", "partitioner", "alpha", "data_dir"})
    r.only(training, "training.",
           {"rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "round_timeout_s", "time_budget_s"})
    r.only(dyn, "dynamics.", {f.name for f in dataclasses.fields(Dynamics)})
    size = len(trace.devices) if trace else sum(g.count for g in groups)
    per_round = r.get(training, "clients_per_round", int, prefix="training.", check=lambda v: 1 <= v <= size,
                      rule=f"must be between 1 and the fleet's {size} devices")
    seed = r.get(raw, "seed", int, 0, check=lambda v: v >= 0, rule="must be >= 0")
    dataset = r.get(data, "dataset", str, prefix="data.")
    where, _, attribute = dataset.rpartition(":")
    if where.endswith(".py"):  # a task file beside the fleet file
        dataset = f"{path.parent / where}:{attribute}"
    try:
        run = RunConfig.from_mapping({
            "dataset": dataset,
            "data-dir": r.get(data, "data_dir", str, None, prefix="data."),
            "partitioner": r.get(data, "partitioner", str, None, prefix="data."),
            "alpha": r.get(data, "alpha", float, 0.3, prefix="data."),
            "clients": size,
            "fraction-train": per_round / size,
            "rounds": r.get(training, "rounds", int, prefix="training."),
            "local-epochs": r.get(training, "local_epochs", int, None, prefix="training."),
            "batch-size": r.get(training, "batch_size", int, 32, prefix="training."),
            "lr": r.get(training, "lr", float, 0.02, prefix="training."),
            "round-timeout": r.get(training, "round_timeout_s", float, prefix="training."),
            "time-budget": r.get(training, "time_budget_s", float, None, prefix="training."),
            "seed": seed,
            "broker": "none",
        })
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    dynamics = Dynamics(
        dropout=r.get(dyn, "dropout", float, 0.0, prefix="dynamics.", check=lambda v: 0 <= v <= 1, rule="in [0, 1]"),
        background_load=r.get(dyn, "background_load", float, 0.0, prefix="dynamics.", check=lambda v: v >= 0,
                              rule="must be >= 0"),
        availability=r.get(dyn, "availability", bool, True, prefix="dynamics."),
        diurnal=r.get(dyn, "diurnal", bool, False, prefix="dynamics."),
        start_hour=r.get(dyn, "start_hour", float, 9.0, prefix="dynamics.", check=lambda v: 0 <= v < 24,
                         rule="must be in [0, 24)"),
        thermal=r.get(dyn, "thermal", bool, True, prefix="dynamics."),
        battery=r.get(dyn, "battery", bool, True, prefix="dynamics."),
        bandwidth_noise=r.get(dyn, "bandwidth_noise", bool, True, prefix="dynamics."),
        heartbeat_s=r.get(dyn, "heartbeat_s", float, 60.0, prefix="dynamics.", check=lambda v: v >= 1,
                          rule="must be >= 1"),
        bad_updates=r.get(dyn, "bad_updates", float, 0.0, prefix="dynamics.", check=lambda v: 0 <= v <= 1,
                          rule="in [0, 1]"),
        malicious=r.get(dyn, "malicious", float, 0.0, prefix="dynamics.", check=lambda v: 0 <= v <= 1,
                        rule="in [0, 1]"),
        attack=r.get(dyn, "attack", str, "sign-flip", prefix="dynamics.", check=lambda v: v in ATTACKS,
                     rule=f"one of {', '.join(ATTACKS)}"),
    )
    return FleetSpec(
        name=r.get(raw, "name", str, path.stem),
        path=path,
        seed=seed,
        target_accuracy=r.get(raw, "target_accuracy", float, check=lambda v: 0 < v <= 1, rule="in (0, 1]"),
        groups=groups,
        dynamics=dynamics,
        run=run,
        trace=trace,
    )


def _group(r: _Reader, raw: Any, where: str, catalog: Catalog) -> DeviceGroup:
    if not isinstance(raw, dict):
        raise ConfigError(f"{r.path}: {where}: expected a table")
    p = f"{where}."
    r.only(raw, p, {"board", "count", "network", "online_s", "offline_s"})
    board = r.get(raw, "board", str, prefix=p, check=lambda v: v in catalog.boards,
                  rule=f"unknown board; known: {', '.join(catalog.boards)}")
    return DeviceGroup(
        board=board,
        count=r.get(raw, "count", int, prefix=p, check=lambda v: v >= 1, rule="must be >= 1"),
        network=r.get(raw, "network", str, prefix=p, check=lambda v: v in catalog.networks,
                      rule=f"unknown network; known: {', '.join(catalog.networks)}"),
        online_s=r.get(raw, "online_s", float, ALWAYS_ON_S, prefix=p, check=lambda v: v > 0, rule="must be > 0"),
        offline_s=r.get(raw, "offline_s", float, 0.0, prefix=p, check=lambda v: v >= 0, rule="must be >= 0"),
    )


_MISSING = object()


@dataclass(frozen=True)
class _Reader:
    """Typed look-ups whose errors say which file and key is wrong."""

    path: Path

    def get(self, table: dict, key: str, kind: type, default: Any = _MISSING, prefix: str = "",
            check: Callable[[Any], bool] | None = None, rule: str = "") -> Any:
        if key not in table:
            if default is _MISSING:
                raise ConfigError(f"{self.path}: {prefix}{key}: missing")
            return default
        value = table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{self.path}: {prefix}{key}: expected {kind.__name__}, got {value!r}")
        if check is not None and not check(value):
            raise ConfigError(f"{self.path}: {prefix}{key}: {rule}, got {value!r}")
        return value

    def only(self, table: dict, prefix: str, allowed: set[str]) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise ConfigError(f"{self.path}: {prefix}{unknown[0]}: unknown key; known: {', '.join(sorted(allowed))}")
