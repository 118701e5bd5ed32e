"""The device catalog: boards and links of virtual fleets, calibrated on real measurements.

catalog.toml (beside this file) holds the derived figures and names their sources; this
module reads it and turns a model's MAC count into seconds of training on a board.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Board:
    name: str
    label: str
    gmacs_per_s: float
    ram_mb: float
    source: str
    measured: bool

    def train_seconds(self, macs_per_sample: int, samples: int) -> float:
        """Seconds this board needs to train `samples` samples of a model (no slowdowns)."""
        return TRAIN_MACS_PER_FORWARD_MAC * macs_per_sample * samples / (self.gmacs_per_s * 1e9)


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
        name: Board(name, b["label"], float(b["gmacs_per_s"]), float(b["ram_mb"]), b["source"], bool(b["measured"]))
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
