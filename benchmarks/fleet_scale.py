"""Benchmark: what a virtual fleet costs in real time and memory as it grows.

1. Scale: fleets of N always-on mid-tier phones (N = 100, 1,000, 10,000 registered devices),
   100 training per round, Fashion-MNIST split `dirichlet-balanced`; real seconds per round
   (after round 1, so Ray's start-up is left out) and the peak resident memory of the whole
   process tree (driver + Ray workers).
2. Overhead: the same training jobs two ways: a 100-device fleet with all 100 training every
   round (virtual-time Grid, Flower's FedAvg, 2 executor nodes) against a plain simulation
   with 100 Flower nodes (edgesched's synchronous loop). Same partitions and per-job seeds,
   so both do the same work; the ratio of seconds per round is the virtual path's overhead.

    python -m benchmarks.fleet_scale [--rounds 6]

A fleet larger than the data set, with the adaptive scheduler planning each round:

    python -m benchmarks.fleet_scale --devices 100000 --per-round 1000 --rounds 3 \
        --partitioner sampled --strategy edgesched --scheduler "pace=rounds"
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

FLEET = """name = "scale-{n}"
target_accuracy = 0.85
[data]
dataset = "fmnist"
partitioner = "{partitioner}"
alpha = 0.3
[training]
rounds = {rounds}
clients_per_round = {per_round}
round_timeout_s = 3600
[dynamics]
dropout = 0.0
background_load = 0.0
availability = false
[[devices]]
board = "phone-mid"
count = {n}
network = "wifi"
"""


def run_measured(args: list[str]) -> float:
    """Run `edgesched ARGS`; return the peak RSS (MB) of its whole process tree."""
    proc = subprocess.Popen([sys.executable, "-m", "edgesched", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    root, peak = psutil.Process(proc.pid), 0.0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20)
        except psutil.Error:
            pass
        time.sleep(0.25)
    if proc.returncode != 0:
        raise RuntimeError(f"edgesched {' '.join(args)} failed: {proc.stderr.read()[-500:]}")
    return peak


def seconds_per_round(out: Path) -> float:
    seconds = [float(r["seconds"]) for r in csv.DictReader((out / "rounds.csv").open())]
    return (seconds[-1] - seconds[0]) / (len(seconds) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per run (default 6)")
    parser.add_argument("--devices", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--per-round", type=int, default=100, help="devices training per round (default 100)")
    parser.add_argument("--partitioner", default="dirichlet-balanced",
                        help="sampled for fleets larger than Fashion-MNIST's 60,000 images")
    parser.add_argument("--strategy", default="fedavg", help="fedavg (default) or edgesched, with --scheduler")
    parser.add_argument("--scheduler", default="", help='edgesched\'s settings, e.g. "pace=rounds"')
    args = parser.parse_args()
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for n in args.devices:
            fleet = tmp / f"scale-{n}.toml"
            fleet.write_text(FLEET.format(n=n, rounds=args.rounds, per_round=args.per_round,
                                          partitioner=args.partitioner))
            out = tmp / f"fleet-{n}"
            settings = ["--scheduler", args.scheduler] if args.scheduler else []
            peak = run_measured(["simulate", "--fleet", str(fleet), "--strategy", args.strategy, *settings,
                                 "--out", str(out)])
            summary = json.loads((out / "summary.json").read_text())
            figures[f"fleet_{n}"] = {"seconds_per_round": round(seconds_per_round(out), 2),
                                     "peak_rss_mb": round(peak), "final_accuracy": summary["final_accuracy"]}
            print(n, figures[f"fleet_{n}"], flush=True)
        if 100 not in args.devices or args.per_round != 100:
            print(json.dumps(figures, indent=2))
            return
        plain = tmp / "plain-100"
        peak = run_measured(["simulate", "--clients", "100", "--partitioner", "dirichlet-balanced", "--alpha", "0.3",
                             "--fraction-train", "1.0", "--rounds", str(args.rounds), "--out", str(plain)])
        summary = json.loads((plain / "summary.json").read_text())
        figures["plain_100"] = {"seconds_per_round": round(seconds_per_round(plain), 2), "peak_rss_mb": round(peak),
                                "final_accuracy": summary["final_accuracy"]}
        if "fleet_100" in figures:
            figures["virtual_over_plain"] = round(
                figures["fleet_100"]["seconds_per_round"] / figures["plain_100"]["seconds_per_round"], 3)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
