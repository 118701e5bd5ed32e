"""Run configuration: one frozen settings class per component, and the run's config that holds them.

The same kebab-case keys come from the CLI, from `flwr run --run-config`, or from a fleet file.
`RunConfig.from_mapping` is the one place that reads them: it refuses unknown keys by name,
coerces strings and numbers to each field's type, fills the data set's defaults (where a key
is missing, and nowhere else), and every settings class checks its values as it is built, with
an error that names the key. A built config holds concrete values only: what ran is what it says.

- `DataSettings`: which data, split how, into how many clients (partitions);
- `TrainingSettings`: what each client job does;
- `SchedulerSettings`: the adaptive scheduler's knobs (docs/scheduler.md), the keys
  `edgesched simulate --scheduler` takes;
- `TelemetrySettings`: the broker the devices' heartbeats come through;
- `RunConfig`: the strategy, the run's length and pace, where it writes, and the four above.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from edgesched.core.pace import PACES, REWARDS
from edgesched.errors import ConfigError

# The choices live here, with the validation, so that importing the config (as the CLI and the
# device agent do) costs no numpy: a small board keeps those megabytes for training.
DATASETS = ("fmnist", "hapt", "digits")  # the shipped tasks (edgesched.tasks)
# A user's own task: `package.module:attribute`, or `/path/to/file.py:attribute`.
TASK_PATH = r"([\w.]+|[^:]+\.py):([A-Za-z_]\w*)"
PARTITIONERS = ("iid", "dirichlet", "dirichlet-balanced", "natural", "sampled")
ROBUST = ("none", "trimmed-mean", "median")  # how the server step combines updates
COMPRESSION = ("off", "adaptive", "8", "4", "2")  # updates' width (edgesched.core.compress)
LARGE_UPDATE = ("clip", "refuse")  # what becomes of an update far larger than usual
PACE_CHOICES = ("learned", *PACES)  # the adaptive scheduler's pace (edgesched.core.pace)
HOLD_CHOICES = ("always", "priced", "never")  # streaming: is a device whose update waits for the step held
ENGINES = ("ray", "in-process")  # where a virtual fleet's real training runs (edgesched.simulations)
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
# What a gateway runs; the simulator also runs the baselines and ablations the side-by-side
# benchmark compares (edgesched.simulations.contenders says what each one is).
GATEWAY_STRATEGIES = ("fedavg", "edgesched")
BASELINES = ("fedavg", "fedprox", "deadline", "fedbuff")  # no adaptive scheduler: its settings do not apply
# The ablations switch one mechanism of the adaptive scheduler off, or fix its pace; the compressed
# variants send updates in fewer bits, chosen per job or fixed (docs/benchmarks.md).
ABLATIONS = ("edgesched-no-prediction", "edgesched-no-staleness", "edgesched-no-equal-finish", "edgesched-no-churn",
             "edgesched-no-reserve", *(f"edgesched-pace-{name}" for name in PACE_CHOICES), "edgesched-compressed",
             "edgesched-compressed-8", "edgesched-early-step", "edgesched-matched-spans", "edgesched-no-absence",
             "edgesched-eager-rounds", "edgesched-step-fill", "edgesched-no-hold", "edgesched-priced",
             "edgesched-no-calm", "edgesched-loss-driven", "edgesched-no-paced-staleness", "edgesched-loss-utility",
             "edgesched-error-reward", "edgesched-short-rounds")
STRATEGIES = (*BASELINES, "edgesched", *ABLATIONS, "oracle")

# Per data set: where it is found and how it is split by default, into how many clients.
# Clients of hapt and digits hold a few hundred samples each: one epoch is a handful of steps,
# so they train 5 local epochs per round (measured: hapt 82.6 % -> 90.1 %, digits 92.0 % ->
# 97.8 % after 20 rounds; docs/benchmarks.md).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "fmnist": {"data-dir": FMNIST_DIR, "partitioner": "dirichlet", "clients": 10, "local-epochs": 1},
    "hapt": {"data-dir": None, "partitioner": "natural", "clients": 30, "local-epochs": 5},
    "digits": {"data-dir": None, "partitioner": "dirichlet", "clients": 10, "local-epochs": 5},
}
OWN_TASK_DEFAULTS: dict[str, Any] = {"data-dir": None, "partitioner": "dirichlet", "clients": 10, "local-epochs": 1}


@dataclass(frozen=True)
class DataSettings:
    dataset: str = "fmnist"
    data_dir: str | None = FMNIST_DIR  # None: the data set needs no folder (digits) or was given none
    partitioner: str = "dirichlet"
    alpha: float = 0.3  # Dirichlet concentration: smaller is more skewed
    clients: int = 10  # partitions: one per client

    def __post_init__(self) -> None:
        _check_task(self.dataset)
        _choice("partitioner", self.partitioner, PARTITIONERS)
        _require(self.alpha > 0, "alpha", "must be > 0", self.alpha)
        _require(self.clients >= 1, "clients", "must be >= 1", self.clients)


@dataclass(frozen=True)
class TrainingSettings:
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.02  # local SGD learning rate (momentum 0.9)
    proximal_mu: float = 0.01  # strategy "fedprox": weight of the clients' proximal term

    def __post_init__(self) -> None:
        _require(self.local_epochs >= 1, "local-epochs", "must be >= 1", self.local_epochs)
        _require(self.batch_size >= 1, "batch-size", "must be >= 1", self.batch_size)
        _require(self.lr > 0, "lr", "must be > 0", self.lr)
        _require(self.proximal_mu >= 0, "proximal-mu", "must be >= 0", self.proximal_mu)


@dataclass(frozen=True)
class SchedulerSettings:
    """The adaptive scheduler's knobs; docs/scheduler.md explains each. FedBuff shares the staleness
    discount, the concurrency cap (`max-overselect`) and the server step (`server-lr`)."""

    max_epochs: int = 2  # default: twice local-epochs, so fast devices do more than FedAvg
    absence_stretch: float = 2.0  # max-epochs grows up to this x for the absence a lost job costs (1: never)
    min_epochs: float = 0.5
    deadline_quantile: float = 0.9
    max_staleness: int = 3
    staleness_exponent: float = 0.5
    min_deadline: float = 1.0
    max_overselect: float = 2.0
    min_round_share: float = 0.5  # after a deadline's wait, a round starts expecting this x clients-per-round
    stream_hold: str = "priced"  # streaming: is a device whose update waits held? "always", "priced", "never"
    priced_max_loss: float = 0.05  # priced hold: only while the fleet loses less than this share of its jobs
    early_step: bool = False  # streaming: step on min-round-share once the held devices could each do a job first
    step_fill: bool = False  # streaming: a fast device trains on until its step is predicted, not idle in the hold
    eager_rounds: bool = False  # rounds: after a deadline's wait, start once every device online is free
    paced_staleness: bool = True  # streamed bounds at the steps' pace; a step of late updates moves the model less
    loss_utility: bool = False  # true: a device's value grows with its last training loss (Oort); false: data alone
    server_lr: float = 1.0
    min_server_lr: float = 0.25  # feedback halves server-lr down to this, not below (>= server-lr: never)
    thin_steps: bool = True  # a step on fewer than clients-per-round updates is scaled by how much updates agree
    fairness_rounds: float = 5.0
    gateway_mbps: float = 0.0
    battery_reserve: float = 20.0
    update_norm_limit: float = 10.0  # x the recent median size per local step
    large_update: str = "clip"  # or "refuse"
    robust_aggregation: str = "none"  # or "trimmed-mean", "median"
    pace: str = "learned"  # when devices get work and the server steps: "stream", "rounds", or "learned" in the run
    matched_spans: bool = True  # learned pace: each pace judged over as long a span as the other's last block
    match_max_loss: float = 0.05  # matched spans: only while the fleet loses less than this share of its jobs
    pace_reward: str = "loss"  # learned pace: a block is judged by how fast the test "loss" or "error" rate fell
    lossy_rounds_steps: int = 6  # learned pace: steps in a block of rounds while spans go unmatched for losses
    compression: str = "off"  # "adaptive" per job from the device's link, or a fixed width in bits
    max_transfer_share: float = 0.1  # adaptive: the widest update whose transfers stay within this share of a job

    def __post_init__(self) -> None:
        _require(self.max_epochs >= 1, "max-epochs", "must be >= 1", self.max_epochs)
        _require(0 < self.min_epochs <= self.max_epochs, "min-epochs", "must be in (0, max-epochs]", self.min_epochs)
        _require(self.absence_stretch >= 1, "absence-stretch", "must be >= 1 (1: off)", self.absence_stretch)
        _require(0 < self.deadline_quantile <= 1, "deadline-quantile", "must be in (0, 1]", self.deadline_quantile)
        _require(self.max_staleness >= 0, "max-staleness", "must be >= 0", self.max_staleness)
        _require(self.staleness_exponent >= 0, "staleness-exponent", "must be >= 0", self.staleness_exponent)
        _require(self.min_deadline > 0, "min-deadline", "must be > 0", self.min_deadline)
        _require(self.max_overselect >= 1, "max-overselect", "must be >= 1", self.max_overselect)
        _require(0 < self.min_round_share <= 1, "min-round-share", "must be in (0, 1]", self.min_round_share)
        _require(self.server_lr > 0, "server-lr", "must be > 0", self.server_lr)
        _require(self.min_server_lr > 0, "min-server-lr", "must be > 0", self.min_server_lr)
        _require(self.stream_hold in HOLD_CHOICES, "stream-hold", f"must be one of {', '.join(HOLD_CHOICES)}",
                 self.stream_hold)
        _require(self.stream_hold == "always" or not self.early_step, "early-step",
                 "needs stream-hold = always (it frees held devices)", self.early_step)
        _require(self.fairness_rounds > 0, "fairness-rounds", "must be > 0", self.fairness_rounds)
        _require(self.gateway_mbps >= 0, "gateway-mbps", "must be >= 0 (0: unlimited)", self.gateway_mbps)
        _require(0 <= self.battery_reserve < 100, "battery-reserve", "must be in [0, 100)", self.battery_reserve)
        _require(self.update_norm_limit > 1, "update-norm-limit", "must be > 1", self.update_norm_limit)
        _require(self.large_update in LARGE_UPDATE, "large-update", f"must be one of {', '.join(LARGE_UPDATE)}",
                 self.large_update)
        _require(self.robust_aggregation in ROBUST, "robust-aggregation", f"must be one of {', '.join(ROBUST)}",
                 self.robust_aggregation)
        _require(0 < self.match_max_loss <= 1, "match-max-loss", "must be in (0, 1] (1: always matched)",
                 self.match_max_loss)
        _require(0 < self.priced_max_loss <= 1, "priced-max-loss", "must be in (0, 1] (1: always priced)",
                 self.priced_max_loss)
        _require(self.pace in PACE_CHOICES, "pace", f"must be one of {', '.join(PACE_CHOICES)}", self.pace)
        _require(self.pace_reward in REWARDS, "pace-reward", f"must be one of {', '.join(REWARDS)}",
                 self.pace_reward)
        _require(self.lossy_rounds_steps >= 1, "lossy-rounds-steps", "must be >= 1",
                 self.lossy_rounds_steps)
        _require(self.compression in COMPRESSION, "compression", f"must be one of {', '.join(COMPRESSION)}",
                 self.compression)
        _require(0 < self.max_transfer_share < 1, "max-transfer-share", "must be in (0, 1)", self.max_transfer_share)


@dataclass(frozen=True)
class TelemetrySettings:
    broker: str = "embedded"  # "embedded" (loopback, port 1883), "none", or mqtt[s]://[user@]host:port
    broker_ca_file: str | None = None  # the CA that signed an mqtts:// broker's certificate
    fleet: str = "default"
    heartbeat_interval: float = 5.0

    def __post_init__(self) -> None:
        _require(self.broker in ("embedded", "none") or self.broker.startswith(("mqtt://", "mqtts://")), "broker",
                 "must be 'embedded', 'none' or an mqtt:// or mqtts:// URL", self.broker)
        _require(self.heartbeat_interval > 0, "heartbeat-interval", "must be > 0", self.heartbeat_interval)


@dataclass(frozen=True)
class RunConfig:
    """Everything a federated run needs. Build it with `from_mapping`, which fills the defaults."""

    strategy: str = "fedavg"
    rounds: int = 20  # server steps; with a time budget, the most it may take
    time_budget: float | None = None  # seconds (virtual on a virtual fleet): no step starts after them
    seed: int = 0  # the split, sampling, initial weights and a virtual fleet's dynamics
    fraction_train: float = 1.0  # share of clients whose update a round wants
    round_timeout: float = 600.0
    client_cpus: float = 1.0
    checkpoint_dir: str | None = None  # gateway: checkpoint every round here; a restart with it resumes
    out_dir: str | None = None  # gateway: write the run directory (model.npz, rounds.csv, ...) here
    onnx_every_round: bool = False  # also write each round's global model as onnx/round-NNNN.onnx
    # gateway: score and record each step while the next step's first jobs run (edgesched.core.engine);
    # a virtual fleet's clock charges nothing for that work, so it has nothing to overlap
    overlap: bool = True
    data: DataSettings = field(default_factory=DataSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)

    def __post_init__(self) -> None:
        _require(self.strategy in STRATEGIES, "strategy", f"choose one of {', '.join(STRATEGIES)}", self.strategy)
        _require(self.rounds >= 1, "rounds", "must be >= 1", self.rounds)
        _require(self.time_budget is None or self.time_budget > 0, "time-budget", "must be > 0", self.time_budget)
        _require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        _require(0 < self.fraction_train <= 1, "fraction-train", "must be in (0, 1]", self.fraction_train)
        _require(self.round_timeout > 0, "round-timeout", "must be > 0", self.round_timeout)
        _require(self.client_cpus > 0, "client-cpus", "must be > 0", self.client_cpus)
        _require(self.scheduler.min_deadline <= self.round_timeout, "min-deadline", "must be in (0, round-timeout]",
                 self.scheduler.min_deadline)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from kebab-case keys: coerced, checked, the data set's defaults where a key is missing."""
        known = _all_fields()
        given = {key: value for key, value in _coerced(values).items()
                 if value is not None and not (value == "" and "None" in str(known[key].type))}
        dataset = given.get("dataset", "fmnist")
        _check_task(dataset)
        where, _, attribute = dataset.rpartition(":")
        if where.endswith(".py"):  # a task file: found from any worker's working directory
            given["dataset"] = f"{os.path.abspath(where)}:{attribute}"
        resolved = {**DATASET_DEFAULTS.get(dataset, OWN_TASK_DEFAULTS), **given}
        resolved.setdefault("max-epochs", 2 * resolved["local-epochs"])
        parts = {name: kind(**_fields_of(kind, resolved)) for name, kind in _PARTS.items()}
        return cls(**_fields_of(cls, resolved), **parts)

    def with_keys(self, values: Mapping[str, Any]) -> RunConfig:
        """This config with some kebab-case keys changed, coerced and checked as in `from_mapping`."""
        return RunConfig.from_mapping({**self.to_mapping(), **values})

    def to_mapping(self) -> dict[str, Any]:
        """Kebab-case keys, `None` values left out: what Flower's run config accepts."""
        flat = {**_own_fields(self), **{k: v for part in self._parts() for k, v in _own_fields(part).items()}}
        return {_kebab(k): v for k, v in flat.items() if v is not None}

    def _parts(self) -> tuple[DataSettings, TrainingSettings, SchedulerSettings, TelemetrySettings]:
        return self.data, self.training, self.scheduler, self.telemetry

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction_train * self.data.clients))


_PARTS: dict[str, type] = {"data": DataSettings, "training": TrainingSettings, "scheduler": SchedulerSettings,
                           "telemetry": TelemetrySettings}
# The adaptive scheduler's settings: what `edgesched simulate --scheduler` may change.
SCHEDULER_KEYS = tuple(f.name.replace("_", "-") for f in fields(SchedulerSettings))


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}: {rule}, got {value!r}")


def _check_task(name: str) -> None:
    """A shipped task's name or the form of a user's own (it is imported where it is used)."""
    if name not in DATASETS and not re.fullmatch(TASK_PATH, name):
        raise ConfigError(f"dataset: unknown {name!r}; choose one of {', '.join(DATASETS)}, or name your own "
                          f"task as module:attribute or /path/to/file.py:attribute")


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: unknown {value!r}; choose one of {', '.join(choices)}")


def _own_fields(obj: Any) -> dict[str, Any]:
    """A settings object's own values (a RunConfig's without its parts)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in _PARTS}


def _fields_of(kind: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values among kebab-case `values` that are fields of `kind` (its parts aside), by field name."""
    return {f.name: values[_kebab(f.name)] for f in fields(kind) if f.name not in _PARTS and _kebab(f.name) in values}


def _all_fields() -> dict[str, dataclasses.Field[Any]]:
    """Every kebab-case key a run config has, with the field it sets."""
    return {_kebab(f.name): f for kind in (RunConfig, *_PARTS.values()) for f in fields(kind) if f.name not in _PARTS}


def _coerced(values: Mapping[str, Any]) -> dict[str, Any]:
    """Kebab-case keys to their fields' types; an unknown key is refused by name."""
    known = _all_fields()
    out = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(known))}")
        out[key] = _coerce(key, value, str(known[key].type))
    return out


def parse_scheduler_keys(text: str) -> dict[str, str]:
    """`edgesched simulate --scheduler`: 'key=value key=value' (flwr run's --run-config form),
    only the adaptive scheduler's keys; the values are coerced by `RunConfig.with_keys`."""
    values = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--scheduler: {pair!r} is not key=value (e.g. \"min-round-share=1.0 max-staleness=2\")")
        if key not in SCHEDULER_KEYS:
            raise ConfigError(f"--scheduler: {key!r} is not a scheduler setting; "
                              f"choose from {', '.join(SCHEDULER_KEYS)}")
        values[key] = value.strip("'\"")
    return values


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """Turn a run-config value into the field's type; TOML and the CLI give strings or numbers."""
    if value is None:
        return None
    kind = annotation.split(" | ")[0]
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "bool":
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            result = float(value)
            if not math.isfinite(result):
                raise ValueError
            return result
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
