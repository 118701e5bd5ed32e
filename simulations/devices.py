"""Virtual devices: when they are online, how long a job takes them, how hot and how charged.

Every random process of every device draws from its own stream,
`default_rng([seed, index, process])`, so what one device does never depends on what other
devices drew, nor on the order the server asks: a seed gives the same fleet behaviour under
any strategy. Times are virtual seconds; nothing here sleeps or reads a clock.

Processes per device (each switchable in the fleet file's [dynamics]):
- availability: exponential online/offline periods per device group, optionally longer
  online at night (diurnal); a job running when the device leaves is lost;
- dropout: a job is lost with probability `dropout` at a uniform moment of its run, and the
  device (its agent restarted) is back after `REJOIN_S` with a new session;
- background load: other work taking a share of the CPU, redrawn every `LOAD_PERIOD_S`;
- heat (boards with a [thermal] entry): a Pi 4 training for minutes reaches 80 C and slows;
- battery (boards with a [battery] entry): drains while unplugged and faster while training,
  charges in plugged periods; an empty unplugged device is off, and a job it was running is lost;
- link: each transfer draws its bandwidth.

A device replayed from a trace (edgesched.trace) is online when the traced one was, trains at
its speed then, and spends its overhead half before and half after training; it has no heat,
battery or link noise of its own (the trace holds what its heat and links did).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from edgesched.simulations.catalog import Battery, Board, Catalog, Network, Thermal, train_seconds
from edgesched.simulations.fleet import DeviceGroup, Dynamics, FleetSpec
from edgesched.trace import DeviceTrace

BANDWIDTH_FLOOR = 0.05  # a transfer never runs below 5 % of the link's mean
LOAD_PERIOD_S = 300.0
REJOIN_S = 60.0
DAY_S = 86_400.0
DIURNAL_AMPLITUDE = 0.5
AVAILABILITY, JOBS, LOAD, POWER, START = range(5)  # random streams per device
TRACED_RAM_MB = 4096.0  # what a replayed device's heartbeats report (a trace does not say)


def diurnal(t: float, dyn: Dynamics) -> float:
    """>1 at night, <1 by day: night makes online and charging periods longer."""
    if not dyn.diurnal:
        return 1.0
    hour = (t / 3600.0 + dyn.start_hour) % 24.0
    return 1.0 + DIURNAL_AMPLITUDE * math.cos(2 * math.pi * hour / 24.0)


@dataclass(frozen=True)
class Job:
    """One job's timeline: dispatched at `dispatched`, started once the device was free."""

    device: int
    dispatched: float
    start: float
    download_s: float
    compute_s: float
    upload_s: float
    drop_at: float | None  # the device vanishes then and never delivers
    cause: str | None = None  # "dropout", "offline" or "battery"
    throttled: bool = False
    session: int = 1  # the device's agent session while it ran

    @property
    def end(self) -> float:
        return self.start + self.download_s + self.compute_s + self.upload_s

    @property
    def compute_start(self) -> float:
        return self.start + self.download_s

    @property
    def delivers(self) -> bool:
        return self.drop_at is None

    @property
    def ends_at(self) -> float:
        """When the device is done with it: delivered or gone."""
        return self.end if self.drop_at is None else self.drop_at

    @property
    def compute_spent_s(self) -> float:
        """Device-seconds of compute actually burnt (up to the drop, if it dropped)."""
        return min(self.compute_s, max(0.0, self.ends_at - self.compute_start))


@dataclass
class VirtualDevice:
    index: int
    device_id: str
    board: Board
    network: Network
    group: DeviceGroup
    down: tuple[float, float]  # kB/s mean, sd
    up: tuple[float, float]
    seed: tuple[int, int]  # (fleet seed, index): the root of the device's random streams
    streams: list[np.random.Generator]
    thermal: Thermal | None  # None: no heat model for this board, or heat switched off
    power: Battery | None  # None: on mains, or battery switched off
    online: bool = True
    next_toggle: float = math.inf
    busy_until: float = 0.0
    down_until: float = 0.0  # after a dropout, until the agent is back
    session: int = 1
    computing: list[tuple[float, float]] = field(default_factory=list)  # [start, end) of compute, in order
    temp: tuple[float, float] = (0.0, 0.0)  # (time, temperature) last settled
    battery: tuple[float, float] = (0.0, 100.0)  # (time, percent) last settled
    plugged: bool = False
    next_plug_toggle: float = math.inf
    load_period: int = -1
    load: float = 0.0
    last_job: tuple[float, float] | None = None  # (samples per second, seconds) of the last delivered job
    trace: DeviceTrace | None = None  # replayed from a trace: its online spells and speeds

    def advance(self, now: float, dyn: Dynamics) -> None:
        """Play the on/off process forward to `now`."""
        rng = self.streams[AVAILABILITY]
        while self.next_toggle <= now:
            t = self.next_toggle
            if self.trace is not None:
                self.online, self.next_toggle = self.trace.online(t), self.trace.next_change(t)
                continue
            self.online = not self.online
            mean = self.group.online_s * diurnal(t, dyn) if self.online else self.group.offline_s / diurnal(t, dyn)
            self.next_toggle = t + rng.exponential(mean)

    def is_up(self, now: float, dyn: Dynamics) -> bool:
        """Online, its agent running, and (on battery) not flat."""
        self.advance(now, dyn)
        return self.online and now >= self.down_until and (self.power is None or self.charge(now, dyn) > 0)

    def train_seconds(self, macs_per_sample: int, samples: int, at: float | None) -> float:
        """Training time without slowdowns: the board's (a replayed device's runs at its trace's
        median speed), or, replayed, the trace's at `at`."""
        if self.trace is None or at is None:
            return self.board.train_seconds(macs_per_sample, samples)
        return train_seconds(macs_per_sample, samples, self.trace.near(at).gmacs_per_s)

    def background(self, now: float, dyn: Dynamics) -> float:
        """Extra slowdown from other work (0.2 = 20 % slower), constant within a load period."""
        period = int(now // LOAD_PERIOD_S)
        if dyn.background_load > 0 and period != self.load_period:
            rng = np.random.default_rng([*self.seed, LOAD, period])
            self.load_period, self.load = period, float(rng.exponential(dyn.background_load))
        return self.load if dyn.background_load > 0 else 0.0

    # -- heat ------------------------------------------------------------------------------
    def temperature(self, now: float) -> float | None:
        thermal = self.thermal
        if thermal is None:
            return None
        t, c = self.temp
        for start, end in self.computing:
            if end <= t or start >= now:
                continue
            if start > t:
                c, t = thermal.cool(c, start - t), start
            stop = min(end, now)
            c, t = thermal.heat(c, stop - t), stop
        return thermal.cool(c, now - t) if now > t else c

    def throttled(self, now: float) -> bool:
        thermal = self.thermal
        temp = self.temperature(now)
        return bool(thermal and temp is not None and temp >= thermal.throttle_c
                    and any(s <= now < e for s, e in self.computing))

    # -- battery ---------------------------------------------------------------------------
    def charge(self, now: float, dyn: Dynamics) -> float:
        """Battery percent at `now` (the plug process is played forward to it)."""
        spec = self.power
        if spec is None:
            return 100.0
        t, pct = self.battery
        while t < now:
            step_end = min(now, self.next_plug_toggle, *self._compute_edges_after(t))
            training = any(s <= t < e for s, e in self.computing)
            pct = float(np.clip(pct + spec.percent_per_s(self.plugged, training) * (step_end - t), 0.0, 100.0))
            t = step_end
            if t >= self.next_plug_toggle:
                self.plugged = not self.plugged
                mean = spec.plugged_s * diurnal(t, dyn) if self.plugged else spec.unplugged_s / diurnal(t, dyn)
                self.next_plug_toggle = t + self.streams[POWER].exponential(mean)
        self.battery = (max(t, self.battery[0]), pct)
        return pct

    def _compute_edges_after(self, t: float) -> list[float]:
        return [edge for s, e in self.computing for edge in (s, e) if edge > t][:1] or [math.inf]

    def flat_at(self, now: float, until: float, dyn: Dynamics, training_from: float) -> float | None:
        """When the battery empties between now and `until`, training from `training_from` on."""
        spec = self.power
        if spec is None or self.plugged:
            return None
        pct = self.charge(now, dyn)
        idle = -spec.percent_per_s(False, False)
        busy = -spec.percent_per_s(False, True)
        before = max(0.0, training_from - now)
        t = now + pct / idle if pct <= idle * before else training_from + (pct - idle * before) / busy
        return t if t < min(until, self.next_plug_toggle) else None


class VirtualFleet:
    def __init__(self, spec: FleetSpec, catalog: Catalog, model_macs: int, model_bytes: int) -> None:
        self.spec = spec
        self.dyn = spec.dynamics
        self.model_macs = model_macs
        self.model_bytes = model_bytes
        self.devices: list[VirtualDevice] = []
        for group in spec.groups:
            for _ in range(group.count):
                self.devices.append(self._create(len(self.devices), group, catalog))
        for traced in spec.trace.devices if spec.trace else ():
            self.devices.append(self._replay(len(self.devices), traced, spec.trace.path))
        self.index = {d.device_id: d.index for d in self.devices}

    def _create(self, index: int, group: DeviceGroup, catalog: Catalog) -> VirtualDevice:
        streams = [np.random.default_rng([self.spec.seed, index, k]) for k in range(5)]
        start = streams[START]
        network = catalog.networks[group.network]
        if network.flash:
            d_mean, d_sd, u_mean, u_sd = catalog.flash_clients[start.integers(len(catalog.flash_clients))]
            down, up = (d_mean, d_sd), (u_mean, u_sd)
        else:
            down, up = network.down_kBps, network.up_kBps
        board = catalog.boards[group.board]
        device = VirtualDevice(index, f"{group.board}-{index:04d}", board, network, group, down, up,
                               (self.spec.seed, index), streams, board.thermal if self.dyn.thermal else None,
                               board.battery if self.dyn.battery else None)
        if self.dyn.availability and group.offline_s > 0:
            cycle = group.online_s + group.offline_s
            device.online = bool(start.random() < group.online_s / cycle)
            mean = group.online_s if device.online else group.offline_s
            device.next_toggle = float(streams[AVAILABILITY].exponential(mean))
        if device.thermal is not None:
            device.temp = (0.0, device.thermal.idle_c)
        if device.power is not None:
            device.battery = (0.0, float(start.uniform(5.0, 100.0)))
            device.plugged = bool(start.random() < 0.25)
            mean = device.power.plugged_s if device.plugged else device.power.unplugged_s
            device.next_plug_toggle = float(streams[POWER].exponential(mean))
        return device

    def _replay(self, index: int, traced: DeviceTrace, source: str) -> VirtualDevice:
        board = Board("traced", "a device of a trace", traced.median_speed(), TRACED_RAM_MB, source, measured=True)
        device = VirtualDevice(index, traced.device, board, Network("trace", 0.0), DeviceGroup(board.name, 1, "trace"),
                               (0.0, 0.0), (0.0, 0.0), (self.spec.seed, index),
                               [np.random.default_rng([self.spec.seed, index, k]) for k in range(5)], None, None,
                               trace=traced)
        device.online, device.next_toggle = traced.online(0.0), traced.next_change(0.0)
        return device

    def online(self, now: float) -> list[int]:
        return [d.index for d in self.devices if d.is_up(now, self.dyn)]

    def next_change(self, now: float) -> float:
        """The next moment any device may come online (an availability, plug or rejoin event)."""
        times = [t for d in self.devices for t in (d.next_toggle, d.next_plug_toggle, d.down_until) if t > now]
        return min(times, default=math.inf)

    def job(self, index: int, now: float, samples: int, moved: tuple[int, int] | None = None) -> Job:
        """Draw the timeline of a job of `samples` training samples dispatched at `now`, carrying
        `moved` bytes down and up (None: the float32 model each way)."""
        device = self.devices[index]
        rng, dyn = device.streams[JOBS], self.dyn
        down_bytes, up_bytes = moved if moved is not None else (self.model_bytes, self.model_bytes)
        start = max(now, device.busy_until)
        download = self._transfer(device, device.down, start, down_bytes)
        compute_start = start + download
        full = device.train_seconds(self.model_macs, samples, compute_start) * \
            (1.0 + device.background(compute_start, dyn))
        compute, throttled = full, False
        if device.thermal is not None:
            compute, _ = device.thermal.compute(device.temperature(compute_start), full)
            throttled = compute > full
        upload = self._transfer(device, device.up, start, up_bytes)
        end = compute_start + compute + upload
        causes = []
        if rng.random() < dyn.dropout:
            causes.append((start + rng.uniform(0.0, end - start), "dropout"))
        if not device.is_up(start, dyn):  # gone before the job reached it
            causes.append((start, "offline"))
        elif device.next_toggle < end:
            causes.append((device.next_toggle, "offline"))
        flat = device.flat_at(start, end, dyn, compute_start)
        if flat is not None:
            causes.append((flat, "battery"))
        drop_at, cause = min(causes) if causes else (None, None)
        job = Job(index, now, start, download, compute, upload, drop_at, cause, throttled, device.session)
        self._occupy(device, job, samples)
        return job

    def _occupy(self, device: VirtualDevice, job: Job, samples: int) -> None:
        """The device is busy until the job ends; a drop restarts its agent after REJOIN_S."""
        if device.thermal is not None:
            device.temp = (job.start, device.temperature(job.start))
        settled = min(job.start, device.battery[0]) if device.power is not None else job.start
        device.computing = [(s, e) for s, e in device.computing if e > settled]
        device.busy_until = job.ends_at
        stop = min(job.ends_at, job.compute_start + job.compute_s)
        if stop > job.compute_start:
            device.computing.append((job.compute_start, stop))
        if job.drop_at is not None:
            device.down_until = job.drop_at + REJOIN_S
            device.session += 1
        elif job.compute_s > 0:
            device.last_job = (samples / job.compute_s, job.compute_s)

    def nominal_job_s(self, index: int, samples: int) -> float:
        """A job's time at the board's catalog speed over its links' mean bandwidth: no load, heat or noise."""
        device = self.devices[index]
        if device.trace is not None:
            overhead = statistics.median(i.overhead_s for i in device.trace.intervals)
            return device.train_seconds(self.model_macs, samples, None) + overhead
        return (device.board.train_seconds(self.model_macs, samples)
                + self._link_s(device, device.down[0], self.model_bytes)
                + self._link_s(device, device.up[0], self.model_bytes))

    def _transfer(self, device: VirtualDevice, link: tuple[float, float], at: float, nbytes: int) -> float:
        """One transfer's time. A traced device's is the trace's, half of its job's overhead before
        training and half after, whatever the bytes: a trace does not say how much of that
        overhead was the link's (on the loopback boards, nearly all of it was process start-up)."""
        if device.trace is not None:
            return device.trace.near(at).overhead_s / 2
        mean, sd = link
        kbps = mean if not self.dyn.bandwidth_noise else max(device.streams[JOBS].normal(mean, sd),
                                                                BANDWIDTH_FLOOR * mean)
        return self._link_s(device, kbps, nbytes)

    def _link_s(self, device: VirtualDevice, kbps: float, nbytes: int) -> float:
        return device.network.latency_s + nbytes / (kbps * 1000.0)
