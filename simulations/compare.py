"""One fleet under several strategies: their accuracy against virtual time in one picture, and a
line each on when they reached the fleet's target (`edgesched simulate --compare`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from edgesched.plots import plot_compare
from edgesched.simulations.fleet import FleetSpec


def compare_runs(spec: FleetSpec, run_dirs: list[Path], png: Path) -> str:
    """Draw the runs' curves into `png`; what a reader should take away, as lines of text."""
    curves: dict[str, tuple[list[float], list[float]]] = {}
    lines = []
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        with (run_dir / "rounds.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        label = str(summary["strategy"])
        curves[label] = ([float(r["virtual_seconds"]) for r in rows], [float(r["accuracy"]) for r in rows])
        reached = summary.get("time_to_target_s")
        when = f"reached {spec.target_accuracy:.0%} at {reached:.0f} virtual s" if reached is not None \
            else f"did not reach {spec.target_accuracy:.0%}"
        lines.append(f"  {label:<12} {when}; {summary['final_accuracy']:.2%} after {summary['virtual_seconds']:.0f} "
                     f"virtual s ({summary['rounds']} steps)")
    plot_compare(curves, spec.target_accuracy, f"{spec.name}: the same fleet, seed and data", png)
    first = run_dirs[0]
    return "\n".join([f"on {spec.name}:", *lines,
                      f"see {png} (accuracy against time), {first / 'timeline.png'} (who trained when) and "
                      f"{first / 'decisions.png'}; replay the run: edgesched dashboard {first}"])
