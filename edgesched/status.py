"""`edgesched status RUN_DIR`: the dashboard's view in the terminal, for a running or finished run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from edgesched.errors import ConfigError
from edgesched.observe import STATES, RunWatch


def status(run_dir: Path, devices: int, console: Console | None = None) -> None:
    """Print the run's line, its devices by state, and the first `devices` of them (busiest first)."""
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir} is not a run directory (it has no config.json)")
    watch = RunWatch(run_dir)
    watch.refresh()
    view = watch.view()
    out = console or Console(width=None if sys.stdout.isatty() else 200)  # piped: whole device ids, not cut
    run = view["run"]
    accuracy = view["accuracy"]["accuracy"]
    steps = f"{run['step']}/{run['steps']}" if run["steps"] else str(run["step"])
    last = f"{accuracy[-1]:.2%}" if accuracy else "-"
    age = run["last_write_s_ago"]
    state = run["status"] + (f", last write {age:.0f} s ago" if run["status"] == "running" and age is not None else "")
    clock = "virtual s" if run["clock"] == "virtual" else "s"
    out.print(f"[bold]{run['name']}[/] ({state}): {run['strategy']}"
              f"{' on ' + run['fleet'] if run['fleet'] else ''}, step {steps}, {run['t'] or 0:.0f} {clock}, "
              f"accuracy {last}", highlight=False)
    jobs, beats = view["jobs"], view["heartbeats"]
    out.print("devices: " + ", ".join(f"{view['counts'][s]} {s}" for s in STATES)
              + f"; jobs: {jobs['sent']} sent, {jobs['counted']} counted, {jobs['failed']} failed, {jobs['late']} late"
              + f"; telemetry: {beats['accepted']} in, {sum(beats['dropped'].values())} dropped", highlight=False)
    if devices > 0 and view["devices"]:
        out.print(_table(view["devices"][:devices]))
        if len(view["devices"]) > devices:
            out.print(f"… and {len(view['devices']) - devices} more (--devices N)", highlight=False)


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("device", "board", "state", "heat", "battery", "predicted s", "actual s", "risk", "updates",
                   "last decision"):
        table.add_column(column, justify="right" if column in ("predicted s", "actual s", "risk", "updates")
                         else "left")
    for d in rows:
        heat = "" if d.get("temp_c") is None else f"{d['temp_c']:.0f} °C" + (" throttled" if d.get("throttled") else "")
        battery = "" if d.get("battery_percent") is None else f"{d['battery_percent']:.0f} %"
        table.add_row(d["device"], d.get("board") or "", d["state"], heat, battery, _fixed(d.get("predicted_s"), 1),
                      _fixed(d.get("actual_s"), 1), _fixed(d.get("risk"), 2), str(d.get("counted") or ""),
                      d.get("last") or "")
    return table


def _fixed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"
