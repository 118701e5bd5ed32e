"""Virtual devices: when they are online and how long a job takes them (numpy only).

Each device draws from its own seeded stream (`default_rng([seed, index])`), so what one
device does never depends on what others drew: a seed gives the same fleet behaviour however
the server samples. Times are virtual seconds; nothing here sleeps or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgesched.simulations.catalog import Board, Catalog, Network
from edgesched.simulations.fleet import FleetSpec

BANDWIDTH_FLOOR = 0.05  # a transfer never runs below 5 % of the link's mean


@dataclass(frozen=True)
class Job:
    """One job's timeline from dispatch at `start`: download, compute, upload, or a drop."""

    device: int
    start: float
    download_s: float
    compute_s: float
    upload_s: float
    drop_at: float | None  # the device vanishes then and never delivers

    @property
    def end(self) -> float:
        return self.start + self.download_s + self.compute_s + self.upload_s

    @property
    def delivers(self) -> bool:
        return self.drop_at is None

    @property
    def compute_spent_s(self) -> float:
        """Device-seconds of compute actually burnt (up to the drop, if it dropped)."""
        began = self.start + self.download_s
        stop = began + self.compute_s if self.drop_at is None else min(self.drop_at, began + self.compute_s)
        return max(0.0, stop - began)


@dataclass
class VirtualDevice:
    index: int
    device_id: str
    board: Board
    network: Network
    down: tuple[float, float]  # kB/s mean, sd
    up: tuple[float, float]
    online_s: float
    offline_s: float
    rng: np.random.Generator
    online: bool = True
    next_toggle: float = np.inf

    def advance(self, now: float) -> None:
        """Play the on/off process forward to `now`."""
        while self.next_toggle <= now:
            self.online = not self.online
            self.next_toggle += self.rng.exponential(self.online_s if self.online else self.offline_s)


class VirtualFleet:
    def __init__(self, spec: FleetSpec, catalog: Catalog, model_macs: int, model_bytes: int) -> None:
        self.spec = spec
        self.model_macs = model_macs
        self.model_bytes = model_bytes
        self.devices: list[VirtualDevice] = []
        for group in spec.groups:
            for _ in range(group.count):
                index = len(self.devices)
                rng = np.random.default_rng([spec.seed, index])
                network = catalog.networks[group.network]
                if network.flash:
                    d_mean, d_sd, u_mean, u_sd = catalog.flash_clients[rng.integers(len(catalog.flash_clients))]
                    down, up = (d_mean, d_sd), (u_mean, u_sd)
                else:
                    down, up = network.down_kBps, network.up_kBps
                device = VirtualDevice(index, f"{group.board}-{index:04d}", catalog.boards[group.board], network,
                                       down, up, group.online_s, group.offline_s, rng)
                if spec.dynamics.availability and group.offline_s > 0:
                    cycle = group.online_s + group.offline_s
                    device.online = bool(rng.random() < group.online_s / cycle)
                    device.next_toggle = rng.exponential(group.online_s if device.online else group.offline_s)
                self.devices.append(device)

    def online(self, now: float) -> list[int]:
        for device in self.devices:
            device.advance(now)
        return [d.index for d in self.devices if d.online]

    def next_change(self) -> float:
        return min(d.next_toggle for d in self.devices)

    def job(self, index: int, now: float, samples: int) -> Job:
        """Draw the timeline of a job of `samples` training samples dispatched at `now`."""
        device = self.devices[index]
        rng, dyn = device.rng, self.spec.dynamics
        download = self._transfer(device, device.down)
        slowdown = 1.0 + (rng.exponential(dyn.background_load) if dyn.background_load > 0 else 0.0)
        compute = device.board.train_seconds(self.model_macs, samples) * slowdown
        upload = self._transfer(device, device.up)
        total = download + compute + upload
        drop_at = now + rng.uniform(0.0, total) if rng.random() < dyn.dropout else None
        if device.next_toggle < now + total:  # goes offline mid-job
            drop_at = min(drop_at if drop_at is not None else np.inf, device.next_toggle)
        return Job(index, now, download, compute, upload, None if drop_at is None else float(drop_at))

    def _transfer(self, device: VirtualDevice, link: tuple[float, float]) -> float:
        mean, sd = link
        kbps = max(device.rng.normal(mean, sd), BANDWIDTH_FLOOR * mean)
        return device.network.latency_s + self.model_bytes / (kbps * 1000.0)
