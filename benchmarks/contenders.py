"""Benchmark: every strategy on the same virtual fleets, data, seeds and dropout levels.

Each run is a separate `edgesched simulate --fleet ...` process (on Ray, it starts clean each
time; `--engine in-process` trains without Ray, with the same results) writing its own run
directory; a run whose summary.json exists is not repeated, so an interrupted benchmark picks
up where it stopped, and two harnesses on one `--out` wait for each other's runs rather than
write one twice. Every contender runs for the same virtual time (the fleet's `time_budget_s`, or
`--time-budget`). The table gives, per fleet and dropout level, each
contender's virtual time to two targets — 5 points below the fleet's target accuracy, and the
target — as mean ± standard deviation over the seeds that reached it, with the fastest baseline's
mean time over its own; its accuracy at a quarter, half and all of the budget; the share of its
jobs lost, the median error of its predicted job times, its server steps, compute
(device-seconds, the energy proxy), traffic and real seconds. Under the tables, the goals cell by
cell: edgesched against the best baseline, by the means and seed by seed.

Run folders are scratch; `--docs` keeps what the table needs. It merges every finished run under
`--out` into docs/contenders-runs.jsonl (one line per fleet, dropout, contender and seed: the
figures, the accuracy curve and the commit that ran it; a rerun replaces its line), and draws the
table and plots from that file. So the table grows across machines and sessions, and each of its
lines can be traced to the code that produced it.

`--fleets` takes shipped fleets' names or fleet files' paths: a fleet you wrote runs like a
shipped one, its runs and table labelled by the fleet's own `name`. A table's means are over the
seeds every contender in it ran; runs of other seeds are named under the table, not averaged in.

    python -m benchmarks.contenders --quick --engine in-process   # CI: the harness
    python -m benchmarks.contenders --docs           # the full table into docs/
    python -m benchmarks.contenders --fleets hapt-30 --data-dir DIR   # HAPT by user
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from statistics import mean, pstdev, stdev
from typing import Any

from edgesched.config import BASELINES, ENGINES, STRATEGIES
from edgesched.simulations.fleet import load_fleet

CONTENDERS = STRATEGIES
DOCS = Path(__file__).resolve().parent.parent / "docs"
RUNS_FILE = DOCS / "contenders-runs.jsonl"
KEY = ("fleet", "dropout", "strategy", "seed")
START, END = "<!-- contenders:start -->", "<!-- contenders:end -->"
# The fleet's target_accuracy is a stretch that slow baselines may never reach in their rounds;
# a second target this far below it gives every contender a time, so ratios are not bounds.
EASIER = 0.05
UNCAPPED = 1_000_000  # steps: with a time budget, every contender runs until it is spent
RUN_LOCK = ".contenders.lock"  # in a run's folder: the harness running it; another one waits


def run_one(fleet: str, dropout: float, strategy: str, seed: int, rounds: int | None, out: Path,
            data_dir: Path | None = None, engine: str = "ray", commit: str = "unknown",
            time_budget: float | None = None) -> dict[str, Any]:
    """Run one simulation unless `out` holds a finished one; `fleet` is a shipped fleet's name or a
    fleet file's path; `commit` names the code it runs with."""
    summary = out / "summary.json"
    out.mkdir(parents=True, exist_ok=True)
    with (out / RUN_LOCK).open("ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another harness on the same --out has this run: wait for it
        if not summary.exists():
            _simulate(fleet, dropout, strategy, seed, rounds, out, data_dir, engine, commit, time_budget)
    return json.loads(summary.read_text())


def _simulate(fleet: str, dropout: float, strategy: str, seed: int, rounds: int | None, out: Path,
              data_dir: Path | None, engine: str, commit: str, time_budget: float | None) -> None:
    """One `edgesched simulate` process into `out`; its failure ends the benchmark in one line."""
    cmd = [sys.executable, "-m", "edgesched", "simulate", "--fleet", fleet, "--strategy", strategy,
           "--seed", str(seed), "--dropout", str(dropout), "--out", str(out), "--engine", engine]
    if rounds is None and (time_budget is not None or load_fleet(fleet).run.time_budget is not None):
        rounds = UNCAPPED  # the budget ends the run, not the fleet's step count
    if rounds is not None:
        cmd += ["--rounds", str(rounds)]
    if time_budget is not None:
        cmd += ["--time-budget", str(time_budget)]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"benchmarks.contenders: {' '.join(cmd[2:])} failed: {tail}")
    (out / "commit.txt").write_text(commit + "\n")


def code_version() -> str:
    """The commit of the code that runs the simulations (`-dirty` with uncommitted changes), read
    once when the benchmark starts: a commit made while it runs does not relabel its runs."""
    done = subprocess.run(["git", "-C", str(DOCS.parent), "describe", "--always", "--dirty", "--abbrev=7"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _timed_run(args: argparse.Namespace, fleet: str, dropout: float, strategy: str,
               seed: int) -> tuple[dict[str, Any], float]:
    """Run one; its runs and rows go under the fleet's own name, whatever file it came from."""
    started = time.monotonic()
    name = args.names[fleet]
    out = _run_dir(args.out, name, dropout, strategy, seed)
    summary = run_one(fleet, dropout, strategy, seed, args.rounds, out, args.data_dir, args.engine, args.commit,
                      args.time_budget)
    return row(name, dropout, strategy, seed, summary, out), time.monotonic() - started


def row(fleet: str, dropout: float, strategy: str, seed: int, s: dict[str, Any], out: Path) -> dict[str, Any]:
    """One run's figures: its virtual time to each of the table's targets and its accuracy curve
    (from rounds.csv), the jobs it sent and lost, its prediction error, and the commit that ran it."""
    keys = ("final_accuracy", "best_accuracy", "virtual_seconds", "device_seconds", "bytes_up", "bytes_down",
            "rounds", "seconds", "target_accuracy", "clients_trained", "time_budget_s")
    with (out / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    curve = [(float(r["virtual_seconds"]), float(r["accuracy"])) for r in rounds]
    reached = {_key(t): next((vs for vs, acc in curve if acc >= t), None) for t in targets(s["target_accuracy"])}
    error = (s.get("prediction_error") or {}).get("median_abs_pct")
    return {"fleet": fleet, "dropout": dropout, "strategy": strategy, "seed": seed, "reached": reached,
            "curve": curve, "sent": sum(int(r.get("selected") or 0) for r in rounds),
            "lost": sum(int(r.get("failed") or 0) for r in rounds), "prediction_error_pct": error,
            "commit": (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else "unknown",
            **{k: s.get(k) for k in keys}}


def accuracy_at(curve: list[tuple[float, float]], virtual_s: float) -> float | None:
    """The global model's test accuracy at a virtual moment: its last step finished by then."""
    done = [acc for vs, acc in curve if vs <= virtual_s]
    return done[-1] if done else None


def targets(fleet_target: float) -> tuple[float, float]:
    """The table's targets: one every contender can reach, `EASIER` below the fleet's, and the fleet's."""
    return round(fleet_target - EASIER, 4), fleet_target


def _key(target: float) -> str:
    return f"{target:.4f}"


def _spread(values: list[float], fmt: str) -> str:
    return f"{mean(values):{fmt}} ± {pstdev(values):{fmt}}" if len(values) > 1 else f"{values[0]:{fmt}}"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per (fleet, dropout) one table, a line per contender; then the goals, cell by cell."""
    out: list[str] = []
    goals: list[str] = []
    paired: list[str] = []
    for fleet, dropout in sorted({(r["fleet"], r["dropout"]) for r in rows}):
        everything = [r for r in rows if r["fleet"] == fleet and r["dropout"] == dropout]
        commits = sorted({r.get("commit", "unknown") for r in everything})
        group, left_out = _common_seeds(everything)
        if not group:
            out += [f"### {fleet}, {dropout:.0%} dropout", "", f"Commit: {', '.join(commits)}.", "",
                    f"No seed was run by every contender ({left_out}): nothing to compare.", ""]
            continue
        seeds = sorted({r["seed"] for r in group})
        goal_targets = targets(group[0]["target_accuracy"])
        budget = group[0].get("time_budget_s")
        head = " | ".join(f"to {t:.0%}, virtual s | reached | best other ÷ it" for t in goal_targets)
        at = " | ".join(f"at {f'{share:.0%} of ' if share < 1 else ''}the budget" for share in POINTS)
        out += [f"### {fleet}, {dropout:.0%} dropout ({len(seeds)} seed{'s' * (len(seeds) > 1)}: "
                f"{', '.join(map(str, seeds))})", "",
                f"Commit: {', '.join(commits)}. Time budget: "
                f"{f'{budget:,.0f} virtual s' if budget else 'none (each ran its rounds)'}.", "",
                *([f"Left out, so that every mean is over the same seeds: {left_out}.", ""] if left_out else []),
                f"| contender | {head} | {at} | jobs lost | prediction error | steps | device-s | GB moved | real s |",
                "|---" * 17 + "|"]
        for strategy in CONTENDERS:
            runs = [r for r in group if r["strategy"] == strategy]
            if not runs:
                continue
            cells = " | ".join(_reach_cells(group, runs, strategy, _key(t)) for t in goal_targets)
            points = " | ".join(_accuracy_cell(runs, share) for share in POINTS)
            lost = sum(r.get("lost") or 0 for r in runs) / max(1, sum(r.get("sent") or 0 for r in runs))
            errors = [r["prediction_error_pct"] for r in runs if r.get("prediction_error_pct") is not None]
            error = f"{mean(errors):.1f} %" if errors else "—"
            gb = mean((r["bytes_up"] or 0) + (r["bytes_down"] or 0) for r in runs) / 1e9
            steps, device_s = mean(r["rounds"] for r in runs), mean(r["device_seconds"] for r in runs)
            out.append(f"| {strategy} | {cells} | {points} | {lost:.1%} | {error} | {steps:.0f} | {device_s:,.0f} "
                       f"| {gb:.2f} | {mean(r['seconds'] for r in runs):.0f} |")
        out.append("")
        if any(r["strategy"] == "edgesched" for r in group) and any(r["strategy"] in OTHERS for r in group):
            goals.append(_goal_line(fleet, dropout, group, goal_targets))
            paired.append(_paired_line(fleet, dropout, group, goal_targets))
    if goals:
        out += ["### Goals, cell by cell: edgesched against the best other contender", "",
                f"Other contenders: {', '.join(OTHERS)}. A time is a mean over the cell's seeds, formed only "
                "when every seed reached the target; ratios above 1 mean edgesched is faster.", "",
                f"| cell | to the lower target ({100 * EASIER:.0f} points under) | to the target "
                "| target reached on every seed any contender did | at the budget, against the best other "
                "| against fedavg |", "|---" * 6 + "|", *goals, "",
                "Seed by seed, against the same contender (the best other by its mean): edgesched's time "
                "minus its, over the seeds both reached the target, and edgesched's accuracy at the budget "
                "minus its; mean ± standard error of the differences, and on how many of those seeds "
                "edgesched was ahead. A difference within about two standard errors of zero is one these "
                "seeds cannot tell from noise.", "",
                "| cell | to the lower target, s | to the target, s | at the budget, pp |", "|---" * 4 + "|",
                *paired, ""]
    return "\n".join(out)


POINTS = (0.25, 0.5, 1.0)  # shares of the time budget at which the table reads each run's accuracy
OTHERS = BASELINES  # what edgesched is measured against in the goals


def _accuracy_cell(runs: list[dict[str, Any]], share: float) -> str:
    """Mean ± sd test accuracy at `share` of the time budget (— without a budget, or before a first step)."""
    values = [accuracy_at(r["curve"], share * r["time_budget_s"]) if r.get("time_budget_s") else None for r in runs]
    return "—" if None in values else _spread([100 * v for v in values if v is not None], ".2f") + " %"


def _goal_line(fleet: str, dropout: float, group: list[dict[str, Any]], goal_targets: tuple[float, float]) -> str:
    """The goals of one cell: edgesched's time to each target against the fastest other contender,
    whether it reached the target wherever another contender did (its own ablations are not
    others), and its accuracy at the budget."""
    speed = []
    for target in goal_targets:
        mine = _mean_ttt(group, "edgesched", _key(target))
        best = _fastest_other(group, _key(target))
        if mine is None:
            speed.append("no mean (not every seed)")
        elif best is None:
            speed.append("only edgesched on every seed")
        else:
            speed.append(f"{best[1] / mine:.2f}x {best[0]} ({mine:.0f} s against {best[1]:.0f} s)")
    key = _key(goal_targets[1])
    anyone = {r["seed"] for r in group if r["strategy"] in OTHERS and r["reached"][key] is not None}
    mine_seeds = {r["seed"] for r in group if r["strategy"] == "edgesched" and r["reached"][key] is not None}
    missed = sorted(anyone - mine_seeds)
    everywhere = "yes" if not missed else f"no: seed {', '.join(map(str, missed))}"
    mine_acc, best_acc = _mean_accuracy(group, "edgesched"), _most_accurate_other(group)
    if mine_acc is None or best_acc is None:
        vs_best = vs_fedavg = "—"
    else:
        vs_best = f"{100 * (mine_acc - best_acc[1]):+.2f} pp ({best_acc[0]})"
        fedavg = _mean_accuracy(group, "fedavg")
        vs_fedavg = f"{100 * (mine_acc - fedavg):+.2f} pp" if fedavg is not None else "—"
    return f"| {fleet}, {dropout:.0%} | {speed[0]} | {speed[1]} | {everywhere} | {vs_best} | {vs_fedavg} |"


def _paired_line(fleet: str, dropout: float, group: list[dict[str, Any]],
                 goal_targets: tuple[float, float]) -> str:
    """The goals' comparisons seed by seed, against the contender each goal names."""
    cells = []
    for target in goal_targets:
        key = _key(target)
        fastest = _fastest_other(group, key)
        cells.append(_paired(group, fastest and fastest[0], lambda r, key=key: r["reached"][key], "s",
                             lower_is_ahead=True))
    most_accurate = _most_accurate_other(group)
    cells.append(_paired(group, most_accurate and most_accurate[0], _budget_points, "pp"))
    return f"| {fleet}, {dropout:.0%} | {' | '.join(cells)} |"


def _fastest_other(group: list[dict[str, Any]], key: str) -> tuple[str, float] | None:
    """The other contender with the lowest mean time to a target, and that time (None: none has one)."""
    return min(((s, t) for s in OTHERS if (t := _mean_ttt(group, s, key)) is not None),
               key=lambda st: (st[1], st[0]), default=None)


def _most_accurate_other(group: list[dict[str, Any]]) -> tuple[str, float] | None:
    """The other contender with the highest mean accuracy at the budget, and that accuracy (None: none has one;
    a tie goes to the first in OTHERS)."""
    return max(((s, a) for s in OTHERS if (a := _mean_accuracy(group, s)) is not None),
               key=lambda sa: sa[1], default=None)


def _paired(group: list[dict[str, Any]], other: str | None, value: Callable[[dict[str, Any]], float | None],
            unit: str, lower_is_ahead: bool = False) -> str:
    """edgesched's `value` minus `other`'s on each seed both have one for: mean ± standard error,
    and on how many seeds edgesched is ahead."""
    if other is None:
        return "—"
    mine = {r["seed"]: value(r) for r in group if r["strategy"] == "edgesched"}
    theirs = {r["seed"]: value(r) for r in group if r["strategy"] == other}
    diffs = [mine[s] - theirs[s] for s in sorted(mine.keys() & theirs.keys())
             if mine[s] is not None and theirs[s] is not None]
    if not diffs:
        return f"— ({other}: no seed in common)"
    ahead = sum(d < 0 if lower_is_ahead else d > 0 for d in diffs)
    error = f" ± {stdev(diffs) / math.sqrt(len(diffs)):.2f}" if len(diffs) > 1 else ""
    return f"{mean(diffs):+.2f}{error} {unit} ({other}; ahead on {ahead} of {len(diffs)})"


def _budget_accuracy(r: dict[str, Any]) -> float | None:
    return accuracy_at(r["curve"], r["time_budget_s"]) if r.get("time_budget_s") else None


def _budget_points(r: dict[str, Any]) -> float | None:
    accuracy = _budget_accuracy(r)
    return None if accuracy is None else 100 * accuracy


def _mean_accuracy(group: list[dict[str, Any]], strategy: str) -> float | None:
    """A contender's mean accuracy at the time budget (None: not in the cell, or no budget)."""
    values = [_budget_accuracy(r) for r in group if r["strategy"] == strategy]
    return mean(v for v in values if v is not None) if values and None not in values else None


def _common_seeds(group: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The runs of the seeds every contender in the group ran, and what was left out (or "")."""
    by_strategy: dict[str, set[int]] = {}
    for r in group:
        by_strategy.setdefault(r["strategy"], set()).add(r["seed"])
    common = set.intersection(*by_strategy.values())
    extra = sorted((r["strategy"], r["seed"]) for r in group if r["seed"] not in common)
    return [r for r in group if r["seed"] in common], ", ".join(f"{s} seed {seed}" for s, seed in extra)


def _reach_cells(group: list[dict[str, Any]], runs: list[dict[str, Any]], strategy: str, key: str) -> str:
    """Time to one target (mean ± sd of the seeds that reached it), seeds reached, and the fastest
    other contender's mean time over this one's (both only when every seed got there)."""
    reached = [r["reached"][key] for r in runs if r["reached"][key] is not None]
    time_s = _spread(reached, ".0f") if reached else "not reached"
    mine = _mean_ttt(group, strategy, key)
    others = [t for s in OTHERS if s != strategy and (t := _mean_ttt(group, s, key)) is not None]
    ratio = f"{min(others) / mine:.2f}" if mine and others else "—"
    return f"{time_s} | {len(reached)}/{len(runs)} | {ratio}"


def _mean_ttt(group: list[dict[str, Any]], strategy: str, key: str) -> float | None:
    """Mean time to a target, only if every seed reached it."""
    times = [r["reached"][key] for r in group if r["strategy"] == strategy]
    return mean(times) if times and None not in times else None


def plot(rows: list[dict[str, Any]], docs: Path) -> list[Path]:
    """Accuracy against virtual time per contender, first seed, one figure per (fleet, dropout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for fleet, dropout in sorted({(r["fleet"], r["dropout"]) for r in rows}):
        group = [r for r in rows if r["fleet"] == fleet and r["dropout"] == dropout]
        seed = min(r["seed"] for r in group)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        first = {r["strategy"]: r for r in group if r["seed"] == seed}
        shown = [s for s in CONTENDERS if s in first]
        for strategy, color in zip(shown, _distinct_colors(len(shown)), strict=True):
            run = first[strategy]
            ax.plot([vs for vs, _ in run["curve"]], [100 * acc for _, acc in run["curve"]], marker=".",
                    label=strategy, color=color, linestyle="--" if "-no-" in strategy else "-",
                    linewidth=2.2 if strategy == "edgesched" else 1.2)
        for target in targets(group[0]["target_accuracy"]):
            ax.axhline(100 * target, color="grey", linewidth=0.8)
        ax.set(xscale="log", xlabel="virtual seconds (log)", ylabel="test accuracy (%)",
               title=f"{fleet}, {dropout:.0%} dropout, seed {seed}")
        ax.legend(fontsize=7, ncol=2)
        out = docs / f"contenders-{fleet}-dropout{round(100 * dropout)}.png"
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        paths.append(out)
    return paths


def _distinct_colors(n: int) -> list[tuple[float, ...]]:
    """`n` colours no two alike while n <= 20: tab20's strong shades first, then its light ones
    (matplotlib's default cycle repeats after ten, and a figure may hold a dozen contenders)."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [tab20(order[i % 20]) for i in range(n)]


def _fleet_name(fleet: str) -> str:
    """A fleet's own name (its file's `name`), for run folders and tables; one line for a bad file."""
    from edgesched.errors import EdgeschedError

    try:
        return load_fleet(fleet).name
    except EdgeschedError as exc:
        raise SystemExit(f"benchmarks.contenders: {exc}") from None


def _run_dir(runs_dir: Path, fleet: str, dropout: float, strategy: str, seed: int) -> Path:
    return runs_dir / fleet / f"dropout{round(100 * dropout)}" / strategy / f"seed{seed}"


def collect(runs_dir: Path) -> list[dict[str, Any]]:
    """The rows of every finished run under `runs_dir` (FLEET/dropoutN/STRATEGY/seedK), each with
    the commit that ran it."""
    rows = []
    for summary in sorted(runs_dir.glob("*/dropout*/*/seed*/summary.json")):
        out = summary.parent
        fleet, dropout, strategy = out.parts[-4], int(out.parts[-3].removeprefix("dropout")) / 100, out.parts[-2]
        if strategy in CONTENDERS:
            rows.append(row(fleet, dropout, strategy, int(out.name.removeprefix("seed")),
                            json.loads(summary.read_text()), out))
    return rows


def merge(runs_file: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add `rows` to the kept runs in `runs_file` (a rerun replaces the line with its key) and
    return them all, sorted by key."""
    kept = [json.loads(line) for line in runs_file.read_text().splitlines()] if runs_file.exists() else []
    by_key = {tuple(r[k] for k in KEY): r for r in [*kept, *rows]}
    merged = [by_key[k] for k in sorted(by_key)]
    runs_file.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in merged))
    return merged


def write_docs(text: str, doc: Path) -> None:
    """Replace the generated section of docs/benchmarks.md (between its markers)."""
    body = doc.read_text()
    if START not in body:
        raise SystemExit(f"benchmarks.contenders: {doc} has no {START} marker to write between")
    head, rest = body.split(START, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="lab-20, 30 %% dropout, seed 0, 1 round, every contender: the harness")
    parser.add_argument("--fleets", nargs="+", default=["campus-100"])
    parser.add_argument("--dropouts", nargs="+", type=float, default=[0.0, 0.1, 0.3])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS, metavar="NAME")
    parser.add_argument("--rounds", type=int, help="override the fleet files' rounds")
    parser.add_argument("--time-budget", type=float, help="virtual seconds every contender may run (then --rounds, "
                        "or the fleet's, caps the steps); the table compares accuracy at it")
    parser.add_argument("--data-dir", type=Path, help="the data set's folder (hapt-30 needs the one holding "
                        "hapt_raw_by_user.npz)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1); more share the "
                        "machine, so their real seconds are not comparable, but virtual times are unchanged")
    parser.add_argument("--engine", choices=ENGINES, default="ray", help="where each run trains: ray (Flower's "
                        "simulation engine) or in-process (one core each, no engine start; same results)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-contenders"), help="run directories")
    parser.add_argument("--docs", action="store_true", help="merge every finished run under --out into "
                        "docs/contenders-runs.jsonl, then write the table and plots of all kept runs into docs/")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.quick:
        args.fleets, args.dropouts, args.seeds, args.rounds = ["lab-20"], [0.3], [0], 1
    args.commit = code_version()
    args.names = {fleet: _fleet_name(fleet) for fleet in args.fleets}
    plan = [(f, d, s, seed) for f in args.fleets for d in args.dropouts for seed in args.seeds for s in args.contenders]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is its own process
        futures = {pool.submit(_timed_run, args, *job): job for job in plan}
        for i, future in enumerate(as_completed(futures), 1):
            if future.exception() is not None:  # report it now; runs already started still finish
                pool.shutdown(wait=False, cancel_futures=True)
            r, took = future.result()
            times = ", ".join(f"{float(t):.0%} at {'never' if vs is None else f'{vs:.0f} virtual s'}"
                              for t, vs in r["reached"].items())
            print(f"[{i}/{len(plan)}] {r['fleet']} dropout {r['dropout']:.0%} {r['strategy']} seed {r['seed']}: "
                  f"final {r['final_accuracy']:.2%}; {times} ({took:.0f} s)", flush=True)
    rows = [f.result()[0] for f in futures]  # in plan order
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    if args.docs:  # every finished run under --out, and every run kept from earlier ones
        rows = merge(RUNS_FILE, collect(args.out))
        text = table(rows)
        plots = plot(rows, DOCS)
        write_docs(text + "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n", DOCS / "benchmarks.md")


if __name__ == "__main__":
    main()
