"""What a run directory says now: the one reading behind the dashboard, /metrics and `edgesched status`.

A run writes its directory as it goes (edgesched.rundir): rounds.csv and jobs.csv gain a row
per step and per counted job, decisions.jsonl (the adaptive scheduler's) and events.jsonl (a
virtual fleet's) a line per decision and moment, and fleet.json is rewritten with every
device's state as the gateway's registry holds it. `RunWatch` reads only what was appended
since it last looked (a resumed run cuts its logs back: then they are read again), so watching
a long run costs little, and `view()` is the one JSON-ready picture that every face shows. A
finished run reads the same way: the dashboard of a run directory is its replay.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import time
from collections import Counter, deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesched.core.decisions import (
    Arrived,
    Decision,
    Expired,
    Lost,
    Quarantined,
    Selected,
    Skipped,
    decision_from_json,
)
from edgesched.core.events import Dispatched, DroppedOut, Event, RoundEnded, Uploaded, event_from_json
from edgesched.core.registry import DeviceState, RegistrySnapshot

FLEET_FILE = "fleet.json"
LOCK_FILE = ".lock"  # held by the process writing a run; removed once its summary is out
STATES = ("training", "online", "stale", "offline")  # a device's state, busiest first
TIMELINE_SPANS = 600  # the newest job spans a view carries
RECENT_DECISIONS = 40


def fleet_record(snapshot: RegistrySnapshot, busy: Collection[str], now: float, step: int,
                 extra_devices: Iterable[tuple[str, bool]] = (), traffic: dict[str, int] | None = None
                 ) -> dict[str, Any]:
    """fleet.json: each device as the registry holds it at `now`, `busy` (ids) marked training.
    `extra_devices`: (id, busy) of devices the gateway knows of only as Flower nodes; `traffic`:
    model bytes moved so far (`down`, `up`), where the transport counts them."""
    rows = [_device_row(state, state.device_id in busy, now) for state in snapshot.devices.values()]
    rows += [{"device": device, "state": "training" if is_busy else "online"} for device, is_busy in extra_devices]
    return {"t": now, "step": step, "devices": sorted(rows, key=lambda r: r["device"]),
            "heartbeats": {"accepted": snapshot.accepted, "dropped": dict(sorted(snapshot.dropped.items()))},
            **({"bytes": traffic} if traffic is not None else {})}


def _device_row(state: DeviceState, busy: bool, now: float) -> dict[str, Any]:
    hb, caps = state.heartbeat, state.capabilities
    where = "offline" if not state.online else "training" if busy else "stale" if state.stale else "online"
    row: dict[str, Any] = {"device": state.device_id, "state": where, "node": state.node_id,
                           "board": caps.board if caps else None, "offline_reason": state.offline_reason,
                           "heard_s_ago": round(now - state.last_seen, 1) if state.last_seen is not None else None}
    if hb is not None:
        row.update(cpu_percent=hb.cpu_percent, temp_c=hb.temp_c, throttled=hb.throttled,
                   battery_percent=hb.battery_percent, charging=hb.charging, net_type=hb.net_type,
                   rtt_ms=hb.rtt_ms, train_sps=hb.train_samples_per_s)
    return row


class _Appended:
    """The complete lines appended to a file since the last call (all of it again after it shrank)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.restart()

    def restart(self) -> None:
        self._offset = 0
        self._partial = b""
        self.header: list[str] | None = None  # a CSV's, once its first line is in

    def read(self) -> tuple[list[str], bool]:
        """(new lines, whether the file was cut back and is being read from its start)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return [], False
        reset = size < self._offset
        if reset:
            self.restart()
        if size == self._offset:
            return [], reset
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = self._partial + f.read(size - self._offset)
        self._offset = size
        *lines, self._partial = chunk.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines if line], reset

    def rows(self, lines: list[str]) -> list[dict[str, str]]:
        """`lines` of a CSV as rows by its header (taken from the file's first line)."""
        rows = []
        for row in csv.reader(lines):
            if self.header is None:
                self.header = row
            else:
                rows.append(dict(zip(self.header, row, strict=False)))
        return rows


@dataclass
class JobSpans:
    """Jobs as spans on a device's timeline, from dispatch to delivery (late or not) or drop."""

    limit: int | None = None
    spans: deque[tuple[str, float, float, str]] = field(default_factory=deque)  # device, start, end, outcome
    step_ends: list[float] = field(default_factory=list)
    _open: dict[tuple[str, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spans = deque(maxlen=self.limit)

    def start(self, device: str, round_: int, t: float) -> None:
        self._open[(device, round_)] = t

    def end(self, device: str, round_: int, t: float, outcome: str) -> None:
        begun = self._open.pop((device, round_), None)
        if begun is not None:
            self.spans.append((device, begun, t, outcome))

    def event(self, t: float, event: Event) -> None:
        """One line of events.jsonl."""
        if isinstance(event, Dispatched):
            self.start(event.device, event.round, t)
        elif isinstance(event, Uploaded):
            self.end(event.device, event.round, t, "late" if event.late else "delivered")
        elif isinstance(event, DroppedOut):
            self.end(event.device, event.round, t, "dropped")
        elif isinstance(event, RoundEnded):
            self.step_ends.append(t)

    def decision(self, d: Decision) -> None:
        """A decision, on a gateway (no events.jsonl): a plan opens a span, its outcome closes it."""
        if isinstance(d, Selected):
            self.start(d.device, d.round, d.t)
        elif isinstance(d, Arrived):
            self.end(d.device, d.round, d.t, "delivered" if d.outcome == "counted" else "late")
        elif isinstance(d, Lost | Expired):
            self.end(d.device, d.round, d.t, "dropped" if isinstance(d, Lost) else "late")

    def in_flight(self) -> list[tuple[str, float]]:
        return [(device, t) for (device, _), t in self._open.items()]


@dataclass
class _DeviceNotes:
    """What the scheduler's decisions and the counted jobs say of one device."""

    predicted_s: float | None = None
    actual_s: float | None = None
    risk: float | None = None
    staleness_bound: int | None = None
    last: str | None = None  # the newest decision about it, in a few words
    counted: int = 0


class RunWatch:
    """A run directory, read as it grows; see the module docstring."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._rounds_file = _Appended(run_dir / "rounds.csv")
        self._jobs_file = _Appended(run_dir / "jobs.csv")
        self._decisions_file = _Appended(run_dir / "decisions.jsonl")
        self._events_file = _Appended(run_dir / "events.jsonl")
        self._fleet_mtime = 0.0
        self._clear()
        self.fleet: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.version = 0  # rises whenever something new was read

    def _clear(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self.jobs_counted = 0
        self.notes: dict[str, _DeviceNotes] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self.first_t: float | None = None  # the first decision's time: a gateway's run starts about then
        self.errors: list[float] = []  # |predicted / actual - 1| of the jobs that came back
        self.late = 0
        self.lost: Counter[str] = Counter()
        self.spans = JobSpans(TIMELINE_SPANS)

    def refresh(self) -> bool:
        """Read what is new; True if anything was."""
        before = self.version
        logs = (self._rounds_file, self._jobs_file, self._decisions_file, self._events_file)
        read = [log.read() for log in logs]
        if any(reset for _, reset in read):  # a resumed run cut its logs back: read them all again
            self._clear()
            for log in logs:
                log.restart()
            read = [log.read() for log in logs]
            self.version += 1
        (rounds, _), (jobs, _), (decisions, _), (events, _) = read
        for record in self._rounds_file.rows(rounds):
            self.rounds.append({k: _number(v) for k, v in record.items()})
            self.version += 1
        for job in self._jobs_file.rows(jobs):
            self.jobs_counted += 1
            self._note(job.get("device_id") or f"node-{job.get('node_id')}").counted += 1
            self.version += 1
        self._take_decisions(decisions)
        self._take_events(events)
        self._take_files()
        return self.version != before

    def _take_decisions(self, lines: list[str]) -> None:
        events_logged = (self.run_dir / "events.jsonl").exists()
        for line in lines:
            try:
                d = decision_from_json(line)
            except (ValueError, TypeError):
                continue
            self.version += 1
            if self.first_t is None:
                self.first_t = d.t
            if not events_logged:
                self.spans.decision(d)
            text = self._take_decision(d)
            if text is not None:
                self.decisions.append({"t": d.t, "round": d.round, "text": text})

    def _take_decision(self, d: Decision) -> str | None:
        """Note a decision; the few words the dashboard shows for it (None: not worth a line)."""
        device = getattr(d, "device", None)
        note = self._note(device) if device is not None else None
        text: str | None = None
        if isinstance(d, Selected):
            assert note is not None
            note.predicted_s, note.risk, note.staleness_bound = d.predicted_mean_s, d.risk, d.staleness_bound
            text = (f"{d.device}: {d.steps} steps, {d.epochs} epoch(s), predicted {d.predicted_mean_s:.1f} s, "
                    f"risk {d.risk:.2f}, may be {d.staleness_bound} late")
            note.last = "selected"
        elif isinstance(d, Skipped):
            assert note is not None
            note.last = f"skipped: {d.reason}"
            return None  # a skip per free device per round: the table shows the newest
        elif isinstance(d, Arrived):
            assert note is not None
            note.actual_s = d.actual_s
            note.last = d.outcome.replace("_", " ")
            self.errors.append(abs(d.error))
            if d.outcome != "counted":
                self.late += 1
            text = f"{d.device}: {d.outcome.replace('_', ' ')}, {d.actual_s:.1f} s against {d.predicted_s:.1f} s"
        elif isinstance(d, Lost):
            assert note is not None
            self.lost[d.reason] += 1
            note.last = f"lost: {d.reason}"
            text = f"{d.device}: lost ({d.reason})"
        elif isinstance(d, Expired):
            assert note is not None
            self.late += 1
            note.last = "expired"
            text = f"{d.device}: expired, too stale to count"
        elif isinstance(d, Quarantined):
            assert note is not None
            note.last = f"quarantined: {d.reason}"
            text = f"{d.device}: quarantined until {d.until:.0f} s ({d.reason})"
        else:
            fields = d.to_dict()
            kind = fields.pop("kind")
            text = f"{kind}: " + ", ".join(f"{k} {_short(v)}" for k, v in fields.items() if k not in ("t", "round"))
        return text

    def _take_events(self, lines: list[str]) -> None:
        for line in lines:
            if '"event": "heartbeat"' in line:
                continue  # the most of them, and not a job's
            try:
                t, event = event_from_json(line)
            except (ValueError, TypeError):
                continue
            self.spans.event(t, event)
            self.version += 1

    def _take_files(self) -> None:
        fleet_path = self.run_dir / FLEET_FILE
        try:
            mtime = fleet_path.stat().st_mtime
            if mtime != self._fleet_mtime:
                self.fleet, self._fleet_mtime = json.loads(fleet_path.read_text()), mtime
                self.version += 1
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if not self.config:
            self.config = _read_json(self.run_dir / "config.json") or {}
        if self.summary is None:
            self.summary = _read_json(self.run_dir / "summary.json")
            if self.summary is not None:
                self.version += 1

    def _note(self, device: str) -> _DeviceNotes:
        return self.notes.setdefault(device, _DeviceNotes())

    # -- the picture ---------------------------------------------------------------------------
    def status(self) -> str:
        if self.summary is None:
            return "running"
        return "stopped" if self.summary.get("stopped") else "finished"

    def view(self) -> dict[str, Any]:
        """Everything the dashboard, /metrics and `edgesched status` show, as plain JSON."""
        virtual = any(r.get("virtual_seconds") not in (None, "") for r in self.rounds)
        time_key = "virtual_seconds" if virtual else "seconds"
        devices = self._devices()
        counts = Counter(d["state"] for d in devices)
        cfg = self.config
        # Times in the decisions and events: virtual seconds from 0 in a simulation, Unix seconds on a
        # gateway, shown there from the run's first decision on, as its rounds' seconds are.
        origin = 0.0 if virtual or self.first_t is None or self.first_t < 1e9 else self.first_t
        now = (self.fleet.get("t") or 0.0) - origin if self.fleet else (self.rounds[-1].get(time_key) if self.rounds
                                                                         else 0.0)
        last_write = max((p.stat().st_mtime for p in self.run_dir.glob("*") if p.is_file()), default=None)
        return {
            "run": {"name": self.run_dir.name, "status": self.status(), "strategy": cfg.get("strategy"),
                    "fleet": cfg.get("fleet"), "dataset": cfg.get("dataset"),
                    "step": int(self.rounds[-1]["round"]) if self.rounds else 0, "steps": cfg.get("rounds"),
                    "clock": "virtual" if virtual else "wall",
                    "t": self.rounds[-1].get(time_key) if self.rounds else 0.0,
                    "wall_seconds": self.rounds[-1].get("seconds") if self.rounds else 0.0,
                    "target_accuracy": cfg.get("target-accuracy"),
                    "last_write_s_ago": round(time.time() - last_write, 1) if last_write else None},
            "accuracy": {"t": [r.get(time_key) for r in self.rounds], "round": [r["round"] for r in self.rounds],
                         "accuracy": [r["accuracy"] for r in self.rounds], "loss": [r["loss"] for r in self.rounds]},
            "step_seconds": {"wall": _steps(self.rounds, "seconds"),
                             "virtual": _steps(self.rounds, "virtual_seconds") if virtual else []},
            "devices": devices,
            "counts": {state: counts.get(state, 0) for state in STATES},
            "jobs": {"sent": int(sum(r["selected"] for r in self.rounds)), "counted": self.jobs_counted,
                     "failed": int(sum(r["failed"] for r in self.rounds)), "late": self.late,
                     "lost": dict(self.lost)},
            "heartbeats": self.fleet.get("heartbeats", {"accepted": 0, "dropped": {}}),
            "bytes": self.fleet.get("bytes"),
            "prediction_error": _median(self.errors),
            "timeline": [{"device": d, "start": s - origin, "end": e - origin, "outcome": o}
                         for d, s, e, o in self.spans.spans]
            + [{"device": d, "start": s - origin, "end": None, "outcome": "running"}
               for d, s in self.spans.in_flight()],
            "timeline_now": now,
            "decisions": [{**d, "t": d["t"] - origin} for d in reversed(self.decisions)],
        }

    def _devices(self) -> list[dict[str, Any]]:
        """fleet.json's devices with what the decisions and jobs say of each; decisions on a
        gateway name a device by its Flower node (`node-N`), joined here through the registry."""
        rows = {row["device"]: dict(row) for row in self.fleet.get("devices", [])}
        by_node = {f"node-{row['node']}": device for device, row in rows.items() if row.get("node") is not None}
        for name, note in self.notes.items():
            device = by_node.get(name, name)
            row = rows.setdefault(device, {"device": device, "state": "offline"})
            row.update(predicted_s=note.predicted_s, actual_s=note.actual_s, risk=note.risk,
                       staleness_bound=note.staleness_bound, last=note.last,
                       counted=row.get("counted", 0) + note.counted)
        order = {state: i for i, state in enumerate(STATES)}
        return sorted(rows.values(), key=lambda r: (order.get(r["state"], len(STATES)), r["device"]))


def _number(value: str) -> Any:
    try:
        number = float(value)
    except ValueError:
        return value if value else None
    if math.isnan(number):
        return None
    return int(number) if number.is_integer() and "." not in value else number


def _steps(rounds: list[dict[str, Any]], key: str) -> list[float]:
    """Each step's duration on one clock."""
    times = [0.0] + [float(r[key]) for r in rounds if r.get(key) is not None]
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
