"""Fleet traces: when each device was online and how fast it trained, as a CSV file.

A gateway records one into its run directory (`trace.csv`, from what its registry and its jobs
showed); users can write one from their own logs. The simulator replays it (`edgesched simulate
--trace`): each virtual device is online exactly when the traced one was, so a job running when
it left is lost, and trains at the traced speed, so a job's time follows the simulated model's
cost. docs/traces.md is the format's reference; every malformed input is refused with one line
naming the file, the line and what is wrong.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from edgesched.core.telemetry import valid_id
from edgesched.errors import ConfigError
from edgesched.simulations.catalog import TRAIN_MACS_PER_FORWARD_MAC, train_seconds

REQUIRED = ("device", "start_s", "end_s", "gmacs_per_s")
OPTIONAL = ("overhead_s",)
MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Interval:
    """A device online from `start_s` to `end_s`, training at `gmacs_per_s` billion forward-pass
    multiply-accumulates per second, each job spending `overhead_s` besides (start-up, transfers)."""

    start_s: float
    end_s: float
    gmacs_per_s: float
    overhead_s: float = 0.0


@dataclass(frozen=True)
class DeviceTrace:
    """One device's online intervals, in order; the trace repeats every `period_s`."""

    device: str
    intervals: tuple[Interval, ...]
    period_s: float
    starts: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", tuple(i.start_s for i in self.intervals))

    def near(self, t: float) -> Interval:
        """The interval covering `t`, else the last one begun before it (the first, early on):
        the speed a device trains at, even while a job it will lose runs."""
        k = bisect.bisect_right(self.starts, t % self.period_s) - 1
        return self.intervals[max(k, 0)]

    def online(self, t: float) -> bool:
        interval = self.near(t)
        return interval.start_s <= t % self.period_s < interval.end_s

    def next_change(self, t: float) -> float:
        """The first moment after `t` at which the device comes or goes (inf: never)."""
        now, cycle = self.online(t), math.floor(t / self.period_s) * self.period_s
        for lap in range(3):  # the rest of this lap, and the next two (an interval may touch the lap's end)
            base = cycle + lap * self.period_s
            for interval in self.intervals:
                for edge in (interval.start_s, interval.end_s):
                    if base + edge > t and self.online(base + edge) != now:
                        return base + edge
        return math.inf

    def online_share(self) -> float:
        return sum(i.end_s - i.start_s for i in self.intervals) / self.period_s

    def median_speed(self) -> float:
        return statistics.median(i.gmacs_per_s for i in self.intervals)


@dataclass(frozen=True)
class Trace:
    path: str
    devices: tuple[DeviceTrace, ...]

    @property
    def period_s(self) -> float:
        return self.devices[0].period_s


def load_trace(path: str | Path) -> Trace:
    """Read and check a trace file; a ConfigError names the file, the line and the fault."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_BYTES // 2**20} MB; not read")
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]  # blank lines and # comments skipped
    if not numbered:
        raise ConfigError(f"{path}: empty; a trace starts with the header {','.join(REQUIRED + OPTIONAL)}")
    header = [h.strip() for h in next(csv.reader([numbered[0][1]]))]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing or unknown or len(set(header)) != len(header):
        fault = (f"no column {missing[0]!r}" if missing else f"unknown column {unknown[0]!r}" if unknown
                 else "a column named twice")
        raise ConfigError(f"{path}: line {numbered[0][0]}: header: {fault}; "
                          f"columns: {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    rows: dict[str, list[tuple[int, Interval]]] = {}
    for n, line in numbered[1:]:
        device, interval = _row(path, n, header, line)
        rows.setdefault(device, []).append((n, interval))
    if not rows:
        raise ConfigError(f"{path}: no rows after the header")
    period = max(i.end_s for found in rows.values() for _, i in found)
    devices = []
    for device, found in rows.items():
        found.sort(key=lambda row: row[1].start_s)
        for (n1, a), (n2, b) in itertools.pairwise(found):
            if b.start_s < a.end_s:
                raise ConfigError(f"{path}: line {n2}: {device} is already online then (line {n1}: "
                                  f"{a.start_s:g} to {a.end_s:g} s); a device's intervals may not overlap")
        devices.append(DeviceTrace(device, tuple(i for _, i in found), period))
    return Trace(str(path), tuple(devices))


def _row(path: Path, n: int, header: list[str], line: str) -> tuple[str, Interval]:
    fields = next(csv.reader([line]))
    if len(fields) != len(header):
        raise ConfigError(f"{path}: line {n}: {len(fields)} fields; the header has {len(header)}")
    values = dict(zip(header, (f.strip() for f in fields), strict=True))
    device = values["device"]
    if not valid_id(device):
        raise ConfigError(f"{path}: line {n}: device {device!r}: 1-64 of letters, digits, '_', '.', '-'")
    number = {}
    for column in REQUIRED[1:] + tuple(c for c in OPTIONAL if c in values):
        try:
            number[column] = float(values[column])
        except ValueError:
            raise ConfigError(f"{path}: line {n}: {column} {values[column]!r} is not a number") from None
        if not math.isfinite(number[column]):
            raise ConfigError(f"{path}: line {n}: {column} {values[column]!r} is not a finite number")
    start, end, speed = number["start_s"], number["end_s"], number["gmacs_per_s"]
    overhead = number.get("overhead_s", 0.0)
    if start < 0:
        raise ConfigError(f"{path}: line {n}: start_s {start:g} is before the trace's start (0)")
    if end <= start:
        raise ConfigError(f"{path}: line {n}: end_s {end:g} is not after start_s {start:g}")
    if speed <= 0:
        raise ConfigError(f"{path}: line {n}: gmacs_per_s {speed:g} must be > 0")
    if overhead < 0:
        raise ConfigError(f"{path}: line {n}: overhead_s {overhead:g} must be >= 0")
    return device, Interval(start, end, speed, overhead)


def write_trace(path: Path, devices: Iterable[tuple[str, Iterable[Interval]]], note: str = "") -> None:
    """Write a trace, `note` as a comment line above it (to a temporary file first: a reader
    never sees half of one)."""
    part = path.with_name(path.name + ".part")
    with part.open("w", newline="") as f:
        if note:
            f.write(f"# {note}\n")
        out = csv.writer(f)
        out.writerow(REQUIRED + OPTIONAL)
        for device, intervals in devices:
            for i in intervals:
                out.writerow([device, f"{i.start_s:.3f}", f"{i.end_s:.3f}", f"{i.gmacs_per_s:.6g}",
                              f"{i.overhead_s:.3f}"])
    part.replace(path)


@dataclass
class _Job:
    finished: float
    gmacs_per_s: float
    overhead_s: float


class TraceRecorder:
    """What a gateway saw of its fleet, as a trace: each device's online spells (from the
    registry, as the engine polls it), cut at each job's end into pieces carrying that job's
    speed and overhead. A job's speed is its samples (at most what its order allowed) over the
    training seconds the device reports (at most the job's time as the gateway measured it);
    the rest of that time is its overhead. So the split is the device's word, but a replayed
    job of the same size at the same moment takes what the gateway measured. A spell without
    a finished job takes the device's median, else the fleet's."""

    def __init__(self, macs_per_sample: int) -> None:
        self.macs_per_sample = macs_per_sample
        self.origin: float | None = None
        self.spells: dict[str, list[list[float]]] = {}  # device -> [[start, end]], the last open while end is inf
        self.jobs: dict[str, list[_Job]] = {}
        self.out: dict[str, tuple[str, float, int]] = {}  # job id -> (device, sent at, samples it may train)

    def presence(self, device: str, online: bool, now: float, left_at: float | None = None) -> None:
        """What the registry says of `device` when the gateway looks at `now`; `left_at`: when an
        offline device's leaving became known (it may be long before the gateway looked)."""
        if self.origin is None:
            self.origin = now
        spells = self.spells.setdefault(device, [])
        is_open = bool(spells) and spells[-1][1] == math.inf
        if online and not is_open:
            spells.append([now, math.inf])
        elif not online and is_open:
            spells[-1][1] = now if left_at is None else left_at
            self.out = {k: job for k, job in self.out.items() if job[0] != device}  # lost by its leaving

    def sent(self, job_id: str, device: str, at: float, samples: int) -> None:
        self.out[job_id] = (device, at, samples)

    def replied(self, job_id: str, finished: float, samples: int, device_train_s: float) -> None:
        """A job's reply with weights: `samples` and `device_train_s` as the device reports them."""
        if job_id in self.out:
            device, at, most = self.out.pop(job_id)
            self.job(device, finished, min(samples, most), device_train_s, finished - at)

    def job(self, device: str, finished: float, samples: int, device_train_s: float, wall_s: float) -> None:
        train_s = min(max(device_train_s, 0.0), wall_s)
        if samples <= 0 or train_s <= 0 or not math.isfinite(train_s):
            return
        self.jobs.setdefault(device, []).append(_Job(finished, self._gmacs(samples, train_s), wall_s - train_s))

    def _gmacs(self, samples: int, seconds: float) -> float:
        """The speed that trains `samples` samples of the run's model in `seconds`."""
        return TRAIN_MACS_PER_FORWARD_MAC * self.macs_per_sample * samples / seconds / 1e9

    def write(self, path: Path, now: float) -> None:
        """The trace up to `now` into `path`, saying when its 0 s was (Unix time)."""
        if self.origin is not None:
            write_trace(path, self.intervals(now), f"recorded by an edgesched gateway; 0 s is Unix time "
                                                   f"{self.origin:.3f}")

    def _pieces(self, device: str, start: float, end: float, jobs: list[_Job], own: tuple[float, float]
                ) -> list[Interval]:
        """A spell cut at each job's end: the piece up to it trained at that job's speed (a board
        throttled mid-spell shows it from its next job on); the rest at the last job's, unless a
        job still out is overdue at that speed: from its start on, the device was at most as
        fast as finishing it at `end` would take."""
        assert self.origin is not None
        pieces, at, last = [], start, own
        for job in sorted(jobs, key=lambda j: j.finished):
            last = (job.gmacs_per_s, job.overhead_s)
            if job.finished > at:
                pieces.append(Interval(at - self.origin, job.finished - self.origin, *last))
                at = job.finished
        overdue = [(sent, most) for owner, sent, most in self.out.values() if owner == device and at <= sent < end
                   and end - sent > last[1] + train_seconds(self.macs_per_sample, most, last[0])]
        if overdue:
            sent, most = min(overdue)
            if sent > at:
                pieces.append(Interval(at - self.origin, sent - self.origin, *last))
            at, last = sent, (self._gmacs(most, end - sent - last[1]), last[1])
        if end > at:
            pieces.append(Interval(at - self.origin, end - self.origin, *last))
        merged: list[Interval] = []
        for piece in pieces:  # one row while nothing changed
            if merged and (merged[-1].gmacs_per_s, merged[-1].overhead_s) == (piece.gmacs_per_s, piece.overhead_s):
                merged[-1] = Interval(merged[-1].start_s, piece.end_s, piece.gmacs_per_s, piece.overhead_s)
            else:
                merged.append(piece)
        return merged

    def intervals(self, now: float) -> list[tuple[str, list[Interval]]]:
        """The trace up to `now`: spells still open end there."""
        if self.origin is None:
            return []
        everyone = [j for jobs in self.jobs.values() for j in jobs]
        if not everyone:
            return []
        fleet = (statistics.median(j.gmacs_per_s for j in everyone), statistics.median(j.overhead_s for j in everyone))
        out = []
        for device, spells in self.spells.items():
            jobs = self.jobs.get(device, [])
            own = (statistics.median(j.gmacs_per_s for j in jobs),
                   statistics.median(j.overhead_s for j in jobs)) if jobs else fleet
            intervals = []
            for start, end in spells:
                end = min(end, now)
                if end > start:
                    intervals += self._pieces(device, start, end, [j for j in jobs if start <= j.finished <= end],
                                              own)
            if intervals:
                out.append((device, intervals))
        return out
