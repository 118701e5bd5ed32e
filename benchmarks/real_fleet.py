"""Benchmark: how well the gateway predicts job times on a fleet of real processes.

A loopback federation as a gateway runs one: Mosquitto, Flower's SuperLink, the edgesched
ServerApp (`flwr run`), and per board a SuperNode (a fresh ClientApp process per job, paying
Python's, Flower's and torch's start each time) and an agent sending heartbeats. The boards are
made unequal with the cgroup v1 CPU controller (`cpu.cfs_quota_us`, so it needs root): each
SuperNode, and every ClientApp it starts, gets a share of one core. During the run one board
is throttled to a quarter of its share, and another is killed (SuperNode and agent) and
started again as a new Flower node under the same device id.

The figure is the scheduler's own: each counted job's mean predicted seconds against its actual
seconds (`decisions.jsonl`, outcome records: `error` = predicted / actual - 1), as the median of
|error| over the jobs of the rounds after `--settle`, with the per-round medians.

    sudo .venv/bin/python -m benchmarks.real_fleet --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.processes import Processes, flower_app, stop_on_sigterm, wait_for
from edgesched.broker import free_port
from edgesched.config import parse_scheduler_keys

BIN = Path(sys.executable).parent
CGROUP = Path("/sys/fs/cgroup/cpu")
ACCOUNTING = Path("/sys/fs/cgroup/cpuacct")  # where cgroup v1 counts each group's CPU use
PERIOD_US = 100_000
# Each board's share of one core, trained on one thread. Together they take 1.3 of the machine's
# two cores, leaving the rest to the gateway (SuperLink, ServerApp, broker): boards on a shared
# machine that asked for more would slow each other down, which real boards do not.
BOARDS = {"pi-fast": 0.5, "pi-mid": 0.35, "pi-slow": 0.2, "pi-restart": 0.25}
THROTTLED, RESTARTED = "pi-mid", "pi-restart"
APP = flower_app("edgesched-real-fleet", "job-time prediction on a loopback fleet") + """dataset = "{dataset}"
partitioner = "{partitioner}"
strategy = "edgesched"
clients = {clients}
rounds = {rounds}
round-timeout = 300.0
broker = "mqtt://127.0.0.1:{broker}"
heartbeat-interval = 1.0
out-dir = "{out}"
"""


class Fleet:
    def __init__(self, folder: Path, dataset: str, rounds: int, partitioner: str, settings: dict[str, str]) -> None:
        self.folder, self.out = folder, folder / "run"
        self.broker, self.link = free_port(), free_port()
        home = folder / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.link}"\ninsecure = true\n')
        (folder / "app").mkdir()
        (folder / "app" / "pyproject.toml").write_text(APP.format(dataset=dataset, clients=len(BOARDS), rounds=rounds,
                                                                  partitioner=partitioner, broker=self.broker,
                                                                  out=self.out)
                                                      + "".join(f'{k} = "{v}"\n' for k, v in settings.items()))
        (folder / "mosquitto.conf").write_text(f"listener {self.broker} 127.0.0.1\nallow_anonymous true\n"
                                               f"persistence false\n")
        self.procs = Processes(folder, {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                                        "PATH": f"{BIN}:{os.environ['PATH']}"})

    def start(self) -> None:
        self.procs.start("mosquitto", shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c",
                         self.folder / "mosquitto.conf")
        self.procs.start("superlink", BIN / "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port",
                         str(self.link), "--disable-runtime-dependency-installation")
        for board, share in BOARDS.items():
            self.limit(board, share)
            self.start_board(board)
        wait_for(lambda: self.procs.log("superlink").count("Activated node_id") >= len(BOARDS), 120,
                 "the boards' SuperNodes registering")

    def start_board(self, board: str) -> None:
        state = self.folder / f"state-{board}"
        supernode = self.procs.start(board, BIN / "flower-supernode", "--insecure", "--superlink",
                                     f"127.0.0.1:{self.link}", "--port", str(free_port()), "--node-config",
                                     f"device-id='{board}'", EDGESCHED_STATE_DIR=str(state), OMP_NUM_THREADS="1")
        for controller in (CGROUP, ACCOUNTING):
            (controller / f"edgesched-{board}" / "cgroup.procs").write_text(str(supernode.pid))
        # Like an agent on its own board, it reports the load of the board's CPU: the cgroup's.
        self.procs.start(f"agent-{board}", sys.executable, "-m", "edgesched", "agent", "--broker",
                         f"mqtt://127.0.0.1:{self.broker}", "--device-id", board, "--interval", "1",
                         "--cgroup", CGROUP / f"edgesched-{board}", EDGESCHED_STATE_DIR=str(state))

    def limit(self, board: str, share: float) -> None:
        (ACCOUNTING / f"edgesched-{board}").mkdir(exist_ok=True)
        group = CGROUP / f"edgesched-{board}"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)))

    def rounds(self) -> int:
        path = self.out / "rounds.csv"
        return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0

    def stop(self) -> None:
        self.procs.stop_all()
        for board in BOARDS:
            for controller in (CGROUP, ACCOUNTING):
                group = controller / f"edgesched-{board}"
                if group.exists():
                    for pid in (group / "cgroup.procs").read_text().split():  # leftovers go back to the root
                        (controller / "cgroup.procs").write_text(pid)
                    group.rmdir()


def run(rounds: int, dataset: str, folder: Path, settle: int, partitioner: str, settings: dict[str, str]) -> dict:
    fleet = Fleet(folder, dataset, rounds, partitioner, settings)
    events: dict[str, float] = {}
    try:
        fleet.start()
        flwr = fleet.procs.start("flwr-run", BIN / "flwr", "run", folder / "app", "local", "--stream")
        wait_for(lambda: fleet.rounds() >= 2 or flwr.poll() is not None, 900, "round 2")
        events["killed"] = time.time()
        fleet.procs.kill(RESTARTED)
        fleet.procs.kill(f"agent-{RESTARTED}")
        time.sleep(10)
        events["restarted"] = time.time()
        fleet.start_board(RESTARTED)
        wait_for(lambda: fleet.rounds() >= 4 or flwr.poll() is not None, 900, "round 4")
        events["throttled"] = time.time()
        fleet.limit(THROTTLED, BOARDS[THROTTLED] / 4)
        wait_for(lambda: flwr.poll() is not None, 1800, "the end of the run")
    finally:
        fleet.stop()
    return summarise(fleet.out, settle, events)


def summarise(out: Path, settle: int, events: dict[str, float]) -> dict:
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    counted = [d for d in decisions if d["kind"] == "outcome" and d["outcome"] == "counted"]
    by_round: dict[int, list[float]] = {}
    for d in counted:
        by_round.setdefault(d["round"], []).append(abs(d["error"]))
    later = [e for r, errors in by_round.items() if r > settle for e in errors]
    return {
        "jobs": len(counted),
        "median_abs_error_after_settle": statistics.median(later) if later else None,
        "jobs_after_settle": len(later),
        "median_abs_error_by_round": {r: round(statistics.median(e), 3) for r, e in sorted(by_round.items())},
        "actual_s_median": statistics.median(d["actual_s"] for d in counted) if counted else None,
        "events": events,
        "counted": [{k: d[k] for k in ("round", "device", "error", "actual_s", "samples", "t")} for d in counted],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--settle", type=int, default=5, help="rounds left out of the figure")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--partitioner", default="dirichlet",
                        help="iid gives every board the same share: its trace's job times compare across runs")
    parser.add_argument("--scheduler", default="", help="scheduler settings, 'key=value key=value'")
    parser.add_argument("--time-budget", type=float, help="seconds the run may take (then --rounds caps the steps)")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    stop_on_sigterm()
    if not os.access(CGROUP / "cgroup.procs", os.W_OK):
        sys.exit(f"real_fleet: error: {CGROUP} is not writable (run as root on a cgroup v1 machine)")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="real-fleet-"))
    folder.mkdir(parents=True, exist_ok=True)
    settings = parse_scheduler_keys(args.scheduler)
    if args.time_budget:
        settings["time-budget"] = str(args.time_budget)
    result = run(args.rounds, args.dataset, folder, args.settle, args.partitioner, settings)
    (folder / "prediction.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "counted"}, indent=1))
    print(f"median |predicted/actual - 1| after round {args.settle}: {result['median_abs_error_after_settle']:.1%} "
          f"over {result['jobs_after_settle']} jobs; details in {folder / 'prediction.json'}")


if __name__ == "__main__":
    main()
