"""Benchmark: what compressed updates save and cost, from the contenders harness's runs.

Reads the finished runs under `--out` (as `benchmarks.contenders` writes them) and compares each
compressed contender with uncompressed `edgesched` on the seeds both ran, fleet by fleet: model
bytes per update up (the mean over the jobs that counted, from jobs.csv), total bytes moved both
ways (summary.json), accuracy at the time budget and held over the budget's last quarter (one
step's swing moves the first, not the second), and virtual time to the two targets (first
crossing) and to the fleet's target for three steps running (one step's spike moves the first).

    python -m benchmarks.contenders --fleets campus-100 hapt-30 --dropouts 0.3 --seeds 0 1 2 \\
        --contenders edgesched edgesched-compressed edgesched-compressed-8 --out runs
    python -m benchmarks.compression --out runs
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.contenders import _key, accuracy_at, collect, targets

BASE = "edgesched"


def uplink_per_update(run_dir: Path) -> float:
    with (run_dir / "jobs.csv").open() as f:
        ups = [int(r["bytes_up"]) for r in csv.DictReader(f)]
    return mean(ups) if ups else float("nan")


def held_accuracy(curve: list[tuple[float, float]], start: float, end: float) -> float:
    """The model's accuracy averaged over virtual time from `start` to `end`: each step's model
    counts for as long as it was the global one (what a user stopping at a random moment gets)."""
    held, weight = 0.0, 0.0
    for (at, acc), (until, _) in zip(curve, [*curve[1:], (end, 0.0)], strict=False):
        span = min(until, end) - max(at, start)
        if span > 0:
            held, weight = held + span * acc, weight + span
    return held / weight if weight > 0 else float("nan")


def report(runs_dir: Path) -> str:
    rows = collect(runs_dir)
    lines = ["| fleet, dropout | contender | seeds | update up, KB | ÷ edgesched's | moved, MB | ÷ edgesched's "
             "| accuracy at the budget | against edgesched's | held over its last quarter | against edgesched's "
             "| to the lower target, virtual s | to the fleet's target | there for three steps running "
             "| widths sent |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["fleet"], r["dropout"]), []).append(r)
    for (fleet, dropout), group in sorted(groups.items()):
        seeds = set.intersection(*({r["seed"] for r in group if r["strategy"] == s} for s in _strategies(group)))
        base = {r["seed"]: r for r in group if r["strategy"] == BASE and r["seed"] in seeds}
        for strategy in _strategies(group):
            runs = sorted((r for r in group if r["strategy"] == strategy and r["seed"] in base),
                          key=lambda r: r["seed"])
            if runs:
                lines.append(_line(runs_dir, fleet, dropout, strategy, runs, [base[r["seed"]] for r in runs]))
    return "\n".join(lines)


def _line(runs_dir: Path, fleet: str, dropout: float, strategy: str, runs: list[dict[str, Any]],
          bases: list[dict[str, Any]]) -> str:
    def folder(r: dict[str, Any]) -> Path:
        return runs_dir / r["fleet"] / f"dropout{round(100 * r['dropout'])}" / r["strategy"] / f"seed{r['seed']}"

    up = mean(uplink_per_update(folder(r)) for r in runs)
    base_up = mean(uplink_per_update(folder(r)) for r in bases)
    moved = mean(r["bytes_up"] + r["bytes_down"] for r in runs)
    base_moved = mean(r["bytes_up"] + r["bytes_down"] for r in bases)
    acc = [accuracy_at(r["curve"], r["time_budget_s"]) or 0.0 for r in runs]
    base_acc = [accuracy_at(r["curve"], r["time_budget_s"]) or 0.0 for r in bases]
    held = [_held_last_quarter(r) for r in runs]
    base_held = [_held_last_quarter(r) for r in bases]
    lower, target = (_key(t) for t in targets(runs[0]["target_accuracy"]))
    widths = sorted({int(w) for r in runs for w in _widths(folder(r))})
    return (f"| {fleet}, {dropout:.0%} | {strategy} | {', '.join(str(r['seed']) for r in runs)} | {up / 1e3:,.1f} "
            f"| {base_up / up:.2f} | {moved / 1e6:,.1f} | {base_moved / moved:.2f} | {100 * mean(acc):.2f} % "
            f"| {100 * (mean(acc) - mean(base_acc)):+.2f} pp | {100 * mean(held):.2f} % "
            f"| {100 * (mean(held) - mean(base_held)):+.2f} pp | {_times(runs, lower)} | {_times(runs, target)} "
            f"| {_sustained_times(runs)} | {', '.join(map(str, widths))} |")


def sustained_from(curve: list[tuple[float, float]], target: float, steps: int = 3) -> float | None:
    """When the model first reached `target` to stay for `steps` steps running (None: never): on a
    label-skewed fleet one step can spike past the target and fall back for minutes, and the first
    crossing then times the spike, not the model."""
    for i in range(len(curve) - steps + 1):
        if all(accuracy >= target for _, accuracy in curve[i:i + steps]):
            return curve[i][0]
    return None


def _sustained_times(runs: list[dict[str, Any]]) -> str:
    return _seed_times([sustained_from(r["curve"], r["target_accuracy"]) for r in runs])


def _held_last_quarter(run: dict[str, Any]) -> float:
    budget = float(run["time_budget_s"])
    return held_accuracy(run["curve"], 0.75 * budget, budget)


def _strategies(group: list[dict[str, Any]]) -> list[str]:
    """The group's contenders, edgesched first (the others are compared with it, on the seeds all ran)."""
    return sorted({r["strategy"] for r in group}, key=lambda s: (s != BASE, s))


def _times(runs: list[dict[str, Any]], key: str) -> str:
    return _seed_times([r["reached"][key] for r in runs])


def _seed_times(times: list[float | None]) -> str:
    """Seed by seed, in seed order; "—" a seed that never got there, "(none)" after them if none did."""
    reached = [t for t in times if t is not None]
    return " / ".join("—" if t is None else f"{t:.0f}" for t in times) + ("" if reached else " (none)")


def _widths(run_dir: Path) -> list[str]:
    with (run_dir / "jobs.csv").open() as f:
        return [r["bits"] for r in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the contenders harness's runs folder")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        raise SystemExit(f"benchmarks.compression: {args.out} is not a folder of runs")
    print(report(args.out))


if __name__ == "__main__":
    main()
