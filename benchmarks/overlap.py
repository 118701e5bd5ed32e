"""Benchmark: how long the boards wait for the gateway between rounds, with `overlap` and without.

A loopback federation without telemetry: Flower's SuperLink, the edgesched ServerApp (`flwr
run`, adaptive scheduler in rounds) and one SuperNode per board, each job a fresh ClientApp
process. The same run is made with `overlap = true` and `false`, alternately, `--repeats`
times. Per run:

- **gap**: per round after the first, from the last update the previous step took in
  (decisions.jsonl's outcome records) to the plan of the next round: the time every board
  waits for the gateway (scoring the model, writing the results and the checkpoint, planning);
- **round**: the wall seconds between steps (rounds.csv).

    python -m benchmarks.overlap --rounds 6 --repeats 2
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.processes import Processes, flower_app, stop_on_sigterm, wait_for
from edgesched.broker import free_port

BIN = Path(sys.executable).parent
APP = flower_app("edgesched-overlap", "the gateway's work between rounds") + """dataset = "{dataset}"
partitioner = "iid"
strategy = "edgesched"
pace = "rounds"
clients = {clients}
rounds = {rounds}
round-timeout = 300.0
broker = "none"
out-dir = "{out}"
checkpoint-dir = "{checkpoints}"
overlap = {overlap}
"""


def run(folder: Path, dataset: str, clients: int, rounds: int, overlap: bool) -> dict[str, float]:
    link = free_port()
    home = folder / "flwr-home"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    (folder / "app").mkdir()
    (folder / "app" / "pyproject.toml").write_text(APP.format(
        dataset=dataset, clients=clients, rounds=rounds, out=folder / "run", checkpoints=folder / "checkpoints",
        overlap=str(overlap).lower()))
    procs = Processes(folder, {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                               "PATH": f"{BIN}:{os.environ['PATH']}"})
    try:
        procs.start("superlink", BIN / "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(link),
                    "--disable-runtime-dependency-installation")
        for i in range(clients):
            procs.start(f"board-{i}", BIN / "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link}",
                        "--port", str(free_port()), "--node-config", f"device-id='board-{i}'",
                        EDGESCHED_STATE_DIR=str(folder / f"state-{i}"), OMP_NUM_THREADS="1")
        wait_for(lambda: procs.log("superlink").count("Activated node_id") >= clients, 120, "the boards registering")
        flwr = procs.start("flwr-run", BIN / "flwr", "run", folder / "app", "local", "--stream")
        wait_for(lambda: flwr.poll() is not None, 3600, "the end of the run")
    finally:
        procs.stop_all()
    if not (folder / "run" / "summary.json").exists():
        raise SystemExit(f"benchmarks.overlap: the run failed; see {folder}")
    return measure(folder / "run")


def measure(out: Path) -> dict[str, float]:
    """The median gap and round time of a run directory (see the module docstring)."""
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    planned = {d["round"]: d["t"] for d in decisions if d["kind"] == "round"}
    last_in: dict[int, float] = {}
    for d in decisions:
        if d["kind"] == "outcome" and "arrived_round" in d:
            last_in[d["arrived_round"]] = max(last_in.get(d["arrived_round"], 0.0), d["t"])
    gaps = [planned[r] - last_in[r - 1] for r in planned if r - 1 in last_in]
    with (out / "rounds.csv").open() as f:
        seconds = [float(r["seconds"]) for r in csv.DictReader(f)]
    rounds = [b - a for a, b in itertools.pairwise(seconds)]
    return {"gap_s": statistics.median(gaps), "round_s": statistics.median(rounds), "rounds": len(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    stop_on_sigterm()
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="edgesched-overlap-") as tmp:
        for i in range(args.repeats):
            for overlap in (True, False):
                got = run(Path(tmp) / f"{i}-{overlap}", args.dataset, args.clients, args.rounds, overlap)
                results[overlap].append(got)
                print(f"overlap={str(overlap).lower()}: gap {got['gap_s']:.2f} s, round {got['round_s']:.2f} s",
                      flush=True)
    for overlap, runs in results.items():
        print(f"overlap={str(overlap).lower()}: median gap {statistics.median(r['gap_s'] for r in runs):.2f} s, "
              f"median round {statistics.median(r['round_s'] for r in runs):.2f} s over {len(runs)} runs")


if __name__ == "__main__":
    main()
