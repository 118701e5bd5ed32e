"""The device catalog: boards and links of virtual fleets, calibrated on real measurements.

catalog.toml (beside this file) holds the derived figures and names their sources; this
module reads it and turns a model's MAC count into seconds of training on a board.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):  # fleet files read TOML through this import too
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

CATALOG = Path(__file__).with_name("catalog.toml")
TRAIN_MACS_PER_FORWARD_MAC = 3  # forward + a backward pass costing about twice the forward


def train_seconds(macs_per_sample: int, samples: int, gmacs_per_s: float) -> float:
    """Seconds to train `samples` samples of a model at `gmacs_per_s` (no slowdowns)."""
    return TRAIN_MACS_PER_FORWARD_MAC * macs_per_sample * samples / (gmacs_per_s * 1e9)


@dataclass(frozen=True)
class Thermal:
    """Newton's law of heating and cooling, with a clock that drops at the throttle point.

    While training the board heats toward `load_c`; once at `throttle_c` the firmware holds it
    there by running at `throttled_freq_mhz`, so the rest of the job runs slower in proportion.
    Between jobs it cools toward `idle_c`. Both with time constant `tau_s`.
    """

    idle_c: float
    load_c: float
    tau_s: float
    throttle_c: float
    max_freq_mhz: float
    throttled_freq_mhz: float

    def heat(self, start_c: float, seconds: float) -> float:
        t = self.load_c + (start_c - self.load_c) * math.exp(-seconds / self.tau_s)
        return min(t, max(self.throttle_c, start_c))

    def cool(self, start_c: float, seconds: float) -> float:
        return self.idle_c + (start_c - self.idle_c) * math.exp(-seconds / self.tau_s)

    def seconds_to_throttle(self, start_c: float) -> float:
        if self.load_c <= self.throttle_c:
            return math.inf
        if start_c >= self.throttle_c:
            return 0.0
        return self.tau_s * math.log((self.load_c - start_c) / (self.load_c - self.throttle_c))

    def compute(self, start_c: float, full_speed_s: float) -> tuple[float, float]:
        """(seconds, end temperature) of `full_speed_s` of work started at `start_c`."""
        cool_for = self.seconds_to_throttle(start_c)
        if full_speed_s <= cool_for:
            return full_speed_s, self.heat(start_c, full_speed_s)
        speed = self.throttled_freq_mhz / self.max_freq_mhz
        return cool_for + (full_speed_s - cool_for) / speed, self.throttle_c


@dataclass(frozen=True)
class Battery:
    capacity_wh: float
    idle_w: float  # average use between jobs
    train_w: float  # extra while training
    charge_w: float
    plugged_s: float  # mean length of a charging period
    unplugged_s: float

    def percent_per_s(self, plugged: bool, training: bool) -> float:
        """Rate of change of the charge level, in percent per second."""
        watts = (self.charge_w if plugged else 0.0) - self.idle_w - (self.train_w if training else 0.0)
        return watts / (self.capacity_wh * 3600.0) * 100.0


@dataclass(frozen=True)
class Board:
    name: str
    label: str
    gmacs_per_s: float
    ram_mb: float
    source: str
    measured: bool
    thermal: Thermal | None = None
    battery: Battery | None = None

    def train_seconds(self, macs_per_sample: int, samples: int) -> float:
        """Seconds this board needs to train `samples` samples of a model (no slowdowns)."""
        return train_seconds(macs_per_sample, samples, self.gmacs_per_s)


@dataclass(frozen=True)
class Network:
    """Per-transfer bandwidth ~ Normal(mean, sd) in kB/s, or FLASH's measured clients."""

    name: str
    latency_s: float
    down_kBps: tuple[float, float] | None = None
    up_kBps: tuple[float, float] | None = None
    flash: bool = False


@dataclass(frozen=True)
class Catalog:
    boards: dict[str, Board]
    networks: dict[str, Network]
    flash_clients: tuple[tuple[float, float, float, float], ...]  # down mean, down sd, up mean, up sd


@lru_cache(maxsize=2)
def load_catalog(path: Path = CATALOG) -> Catalog:
    raw = tomllib.loads(path.read_text())
    boards = {
        name: Board(name, b["label"], float(b["gmacs_per_s"]), float(b["ram_mb"]), b["source"], bool(b["measured"]),
                    Thermal(**b["thermal"]) if "thermal" in b else None,
                    Battery(**b["battery"]) if "battery" in b else None)
        for name, b in raw["boards"].items()
    }
    networks = {
        name: Network(
            name,
            float(n["latency_s"]),
            tuple(n["down_kBps"]) if "down_kBps" in n else None,
            tuple(n["up_kBps"]) if "up_kBps" in n else None,
            bool(n.get("flash", False)),
        )
        for name, n in raw["networks"].items()
    }
    flash = tuple(tuple(float(v) for v in client) for client in raw["flash"]["clients"])
    return Catalog(boards, networks, flash)
