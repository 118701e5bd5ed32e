"""Run configuration: one frozen dataclass, kebab-case keys as in Flower's run config.

The same keys come from the CLI, from `flwr run --run-config`, or from a TOML file, and
every value is checked when the config is built, with an error that names the key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from edgesched.errors import ConfigError

# The choices live here, with the validation, so that importing the config (as the CLI and the
# device agent do) costs no numpy: a small board keeps those megabytes for training.
DATASETS = ("fmnist", "hapt", "digits")
PARTITIONERS = ("iid", "dirichlet", "dirichlet-balanced", "natural")
ROBUST = ("none", "trimmed-mean", "median")  # how the server step combines updates
LARGE_UPDATE = ("clip", "refuse")  # what becomes of an update far larger than usual
ENGINES = ("ray", "in-process")  # where a virtual fleet's real training runs (edgesched.simulations)
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
# What a gateway runs; the simulator also runs the baselines and ablations the side-by-side
# benchmark compares (edgesched.simulations.contenders says what each one is).
GATEWAY_STRATEGIES = ("fedavg", "edgesched")
BASELINES = ("fedavg", "fedprox", "deadline", "fedbuff")  # no adaptive scheduler: its settings do not apply
STRATEGIES = (*BASELINES, "edgesched", "edgesched-no-prediction", "edgesched-no-staleness",
              "edgesched-no-equal-finish", "oracle")

# Per data set: where it is found and how it is split by default, into how many clients.
# Clients of hapt and digits hold a few hundred samples each: one epoch is a handful of steps,
# so they train 5 local epochs per round (measured: hapt 82.6 % -> 90.1 %, digits 92.0 % ->
# 97.8 % after 20 rounds; docs/benchmarks.md).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "fmnist": {"partitioner": "dirichlet", "clients": 10, "local_epochs": 1},
    "hapt": {"partitioner": "natural", "clients": 30, "local_epochs": 5},
    "digits": {"partitioner": "dirichlet", "clients": 10, "local_epochs": 5},
}


# The adaptive scheduler's knobs (docs/scheduler.md): what `edgesched simulate --scheduler` may change.
SCHEDULER_KEYS = ("max-epochs", "min-epochs", "deadline-quantile", "min-deadline", "max-staleness",
                  "staleness-exponent", "max-overselect", "min-round-share", "server-lr", "fairness-rounds",
                  "gateway-mbps", "battery-reserve", "update-norm-limit", "large-update", "robust-aggregation")


@dataclass(frozen=True)
class RunConfig:
    """Everything a federated run needs; `None` means "the data set's default"."""

    dataset: str = "fmnist"
    data_dir: str | None = None
    partitioner: str | None = None
    alpha: float = 0.3
    clients: int | None = None
    fraction_train: float = 1.0
    rounds: int = 20
    local_epochs: int | None = None
    batch_size: int = 32
    lr: float = 0.02
    seed: int = 0
    round_timeout: float = 600.0
    client_cpus: float = 1.0
    broker: str = "embedded"  # "embedded" (loopback, port 1883), "none", or mqtt[s]://[user@]host:port
    broker_ca_file: str | None = None  # the CA that signed an mqtts:// broker's certificate
    fleet: str = "default"
    heartbeat_interval: float = 5.0
    # The adaptive scheduler (strategy "edgesched"); docs/scheduler.md explains each knob.
    strategy: str = "fedavg"
    max_epochs: int | None = None  # default: twice local-epochs, so fast devices do more than FedAvg
    min_epochs: float = 0.5
    deadline_quantile: float = 0.9
    max_staleness: int = 3
    staleness_exponent: float = 0.5
    min_deadline: float = 1.0
    max_overselect: float = 2.0
    min_round_share: float = 0.5  # after a deadline's wait, a round starts expecting this x clients-per-round
    server_lr: float = 1.0
    fairness_rounds: float = 5.0
    gateway_mbps: float = 0.0
    battery_reserve: float = 20.0
    proximal_mu: float = 0.01  # strategy "fedprox": weight of the clients' proximal term
    # Update validation (edgesched/validate.py) and the server step's combination of updates.
    update_norm_limit: float = 10.0  # x the recent median size per local step
    large_update: str = "clip"  # or "refuse"
    robust_aggregation: str = "none"  # or "trimmed-mean", "median"
    checkpoint_dir: str | None = None  # gateway: checkpoint every round here; a restart with it resumes
    out_dir: str | None = None  # gateway: write the run directory (model.npz, rounds.csv, ...) here
    onnx_every_round: bool = False  # also write each round's global model as onnx/round-NNNN.onnx

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset: unknown {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        if self.partitioner is not None and self.partitioner not in PARTITIONERS:
            raise ConfigError(f"partitioner: unknown {self.partitioner!r}; choose one of {', '.join(PARTITIONERS)}")
        _require(self.alpha > 0, "alpha", "must be > 0", self.alpha)
        _require(self.clients is None or self.clients >= 1, "clients", "must be >= 1", self.clients)
        _require(0 < self.fraction_train <= 1, "fraction-train", "must be in (0, 1]", self.fraction_train)
        _require(self.local_epochs is None or self.local_epochs >= 1, "local-epochs", "must be >= 1",
                 self.local_epochs)
        for key in ("rounds", "batch_size"):
            _require(getattr(self, key) >= 1, _kebab(key), "must be >= 1", getattr(self, key))
        _require(self.lr > 0, "lr", "must be > 0", self.lr)
        _require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        _require(self.round_timeout > 0, "round-timeout", "must be > 0", self.round_timeout)
        _require(self.client_cpus > 0, "client-cpus", "must be > 0", self.client_cpus)
        _require(self.broker in ("embedded", "none") or self.broker.startswith(("mqtt://", "mqtts://")), "broker",
                 "must be 'embedded', 'none' or an mqtt:// or mqtts:// URL", self.broker)
        _require(self.heartbeat_interval > 0, "heartbeat-interval", "must be > 0", self.heartbeat_interval)
        _require(self.strategy in STRATEGIES, "strategy", f"choose one of {', '.join(STRATEGIES)}", self.strategy)
        _require(self.max_epochs is None or self.max_epochs >= 1, "max-epochs", "must be >= 1", self.max_epochs)
        _require(0 < self.min_epochs <= (self.max_epochs or math.inf), "min-epochs", "must be in (0, max-epochs]",
                 self.min_epochs)
        _require(0 < self.deadline_quantile <= 1, "deadline-quantile", "must be in (0, 1]", self.deadline_quantile)
        _require(self.max_staleness >= 0, "max-staleness", "must be >= 0", self.max_staleness)
        _require(self.staleness_exponent >= 0, "staleness-exponent", "must be >= 0", self.staleness_exponent)
        _require(0 < self.min_deadline <= self.round_timeout, "min-deadline", "must be in (0, round-timeout]",
                 self.min_deadline)
        _require(self.max_overselect >= 1, "max-overselect", "must be >= 1", self.max_overselect)
        _require(0 < self.min_round_share <= 1, "min-round-share", "must be in (0, 1]", self.min_round_share)
        _require(self.server_lr > 0, "server-lr", "must be > 0", self.server_lr)
        _require(self.fairness_rounds > 0, "fairness-rounds", "must be > 0", self.fairness_rounds)
        _require(self.gateway_mbps >= 0, "gateway-mbps", "must be >= 0 (0: unlimited)", self.gateway_mbps)
        _require(0 <= self.battery_reserve < 100, "battery-reserve", "must be in [0, 100)", self.battery_reserve)
        _require(self.proximal_mu >= 0, "proximal-mu", "must be >= 0", self.proximal_mu)
        _require(self.update_norm_limit > 1, "update-norm-limit", "must be > 1", self.update_norm_limit)
        _require(self.large_update in LARGE_UPDATE, "large-update", f"must be one of {', '.join(LARGE_UPDATE)}",
                 self.large_update)
        _require(self.robust_aggregation in ROBUST, "robust-aggregation", f"must be one of {', '.join(ROBUST)}",
                 self.robust_aggregation)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from kebab-case keys, coercing numbers and refusing unknown keys by name."""
        return cls(**_field_values(values))

    def with_keys(self, values: Mapping[str, Any]) -> RunConfig:
        """This config with some kebab-case keys changed, coerced and checked as in `from_mapping`."""
        return dataclasses.replace(self, **_field_values(values))

    def resolved(self) -> RunConfig:
        """Fill the data-set defaults, so a saved config says exactly what ran."""
        defaults = DATASET_DEFAULTS[self.dataset]
        return dataclasses.replace(
            self,
            data_dir=self.data_dir or (FMNIST_DIR if self.dataset == "fmnist" else None),
            partitioner=self.partitioner or defaults["partitioner"],
            clients=self.clients or defaults["clients"],
            local_epochs=(local_epochs := self.local_epochs or defaults["local_epochs"]),
            max_epochs=self.max_epochs or 2 * local_epochs,
        )

    def to_mapping(self) -> dict[str, Any]:
        """Kebab-case keys, `None` values left out: what Flower's run config accepts."""
        return {_kebab(k): v for k, v in dataclasses.asdict(self).items() if v is not None}

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction_train * (self.clients or 1)))


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}: {rule}, got {value!r}")


def _field_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Kebab-case keys to RunConfig's field names and types; an unknown key is refused by name."""
    known = {_kebab(f.name): f for f in fields(RunConfig)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(known))}")
        kwargs[known[key].name] = _coerce(key, value, known[key].type)
    return kwargs


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
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
