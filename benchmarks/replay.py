"""Benchmark: does a replayed trace behave as the fleet it was recorded from?

Takes the folder of a `benchmarks.real_fleet --keep` run (a loopback federation of real
processes whose gateway wrote `run/trace.csv`) and compares, per device:

- availability: the share of the trace each device was online, as recorded by the harness
  (a board is down from its kill until it registers again) and as the replayed virtual fleet
  has it;
- job time: the median of the recorded jobs' times (`decisions.jsonl`, from sending to the
  reply) against the same jobs replayed (same device, moment and samples) on the virtual fleet,
  and the median of each job's |replayed / recorded - 1|.

Then it replays the whole run on the virtual fleet, for as long as the recorded run took, with
the scheduler's defaults and with each `--tune` setting: tune on the replay, then run the best
on the real fleet (`benchmarks.real_fleet --scheduler`).

    python -m benchmarks.replay /tmp/rf-trace [--save-fixture tests/sim/data] [--tune "pace=rounds"]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.real_fleet import RESTARTED
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import FleetSpec, load_fleet
from edgesched.tasks import model_size
from edgesched.trace import load_trace

ORIGIN = re.compile(r"0 s is Unix time ([0-9.]+)")


def origin_of(trace_path: Path) -> float:
    found = ORIGIN.search(trace_path.read_text().split("\n", 1)[0])
    if found is None:
        sys.exit(f"replay: error: {trace_path}: no '0 s is Unix time' note: not recorded by a gateway")
    return float(found.group(1))


def recorded_jobs(run: Path, origin: float) -> list[dict]:
    """Counted jobs of the gateway's run: device, finish time in trace seconds, samples, seconds."""
    devices = {}
    with (run / "jobs.csv").open() as f:
        for row in csv.DictReader(f):
            devices[f"node-{row['node_id']}"] = row["device_id"]
    jobs = []
    for line in (run / "decisions.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["kind"] == "outcome" and d.get("outcome") == "counted" and d["device"] in devices:
            jobs.append({"device": devices[d["device"]], "t_s": round(d["t"] - origin, 3),
                         "samples": d["samples"], "actual_s": round(d["actual_s"], 3)})
    return jobs


def replayed_job_s(fleet: VirtualFleet, job: dict) -> float:
    """The job's time on its replayed device: what the trace says for its size, when it ran."""
    device = fleet.devices[fleet.index[job["device"]]]
    assert device.trace is not None
    began = job["t_s"] - job["actual_s"]
    interval = device.trace.near(began)
    return interval.overhead_s + device.train_seconds(fleet.model_macs, job["samples"], began)


def availability(fleet: VirtualFleet, period: float, step: float = 1.0) -> dict[str, float]:
    """Each replayed device's online share over one pass of the trace, sampled every `step`."""
    times = [k * step for k in range(int(period / step))]
    return {d.device_id: sum(d.is_up(t, fleet.dyn) for t in times) / len(times) for d in fleet.devices}


def compare(spec: FleetSpec, jobs: list[dict], recorded_up: dict[str, float]) -> dict[str, dict]:
    """Per device: availability and median job time, recorded against replayed."""
    assert spec.trace is not None
    size = model_size(spec.run.data.dataset)
    fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
    replay_up = availability(fleet, spec.trace.period_s)
    table = {}
    for device in sorted(replay_up):
        own = [j for j in jobs if j["device"] == device]
        table[device] = {
            "availability_recorded": recorded_up.get(device), "availability_replayed": replay_up[device],
            "jobs": len(own),
            "median_job_s_recorded": statistics.median(j["actual_s"] for j in own) if own else None,
            "median_job_s_replayed": statistics.median(replayed_job_s(fleet, j) for j in own) if own else None,
            "median_job_error": statistics.median(abs(replayed_job_s(fleet, j) / j["actual_s"] - 1) for j in own)
            if own else None,
        }
    return table


def harness_availability(folder: Path, origin: float, period: float) -> dict[str, float]:
    """Online shares as the harness made them: every board up throughout, but the restarted one,
    down from its kill until it was started again."""
    result = json.loads((folder / "prediction.json").read_text())
    events = result["events"]
    up = {d.device: 1.0 for d in load_trace(folder / "run" / "trace.csv").devices}
    up[RESTARTED] = 1.0 - (events["restarted"] - events["killed"]) / period
    return up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a benchmarks.real_fleet --keep folder")
    parser.add_argument("--save-fixture", type=Path,
                        help="write the recorded jobs and availability there (loopback-jobs.json)")
    parser.add_argument("--tune", nargs="*", default=[], metavar="SETTINGS",
                        help="scheduler settings ('key=value key=value') to replay the run with, besides the defaults")
    parser.add_argument("--target", type=float, default=0.88, help="accuracy whose time is reported")
    args = parser.parse_args()
    trace_path = args.folder / "run" / "trace.csv"
    origin = origin_of(trace_path)
    spec = load_fleet("replay").with_overrides(trace=str(trace_path))
    assert spec.trace is not None
    jobs = recorded_jobs(args.folder / "run", origin)
    table = compare(spec, jobs, harness_availability(args.folder, origin, spec.trace.period_s))
    print(f"{'device':12} {'up rec':>7} {'up rep':>7} {'jobs':>4} {'median s rec':>12} {'median s rep':>12} "
          f"{'job error':>9}")
    for device, row in table.items():
        rec, rep = row["median_job_s_recorded"], row["median_job_s_replayed"]
        print(f"{device:12} {row['availability_recorded']:7.1%} {row['availability_replayed']:7.1%} "
              f"{row['jobs']:4d} {rec or 0:12.1f} {rep or 0:12.1f} {row['median_job_error'] or 0:9.1%}")
    if args.save_fixture:
        args.save_fixture.mkdir(parents=True, exist_ok=True)
        (args.save_fixture / "loopback-jobs.json").write_text(json.dumps(
            {"availability": harness_availability(args.folder, origin, spec.trace.period_s), "jobs": jobs}, indent=1))
    rounds = list(csv.DictReader((args.folder / "run" / "rounds.csv").open()))
    budget = float(rounds[-1]["seconds"])
    print(f"recorded: {len(rounds)} rounds in {budget:.0f} s, accuracy {float(rounds[-1]['accuracy']):.4f}, "
          f"{args.target:.0%} at {reached(rounds, 'seconds', args.target)}")
    for setting in ["", *args.tune]:
        summary, replayed = tune_run(spec, setting, budget)
        print(f"replayed with {setting or 'the defaults'!r}: {summary['rounds']} rounds in {budget:.0f} virtual s, "
              f"accuracy {summary['final_accuracy']:.4f}, {args.target:.0%} at "
              f"{reached(replayed, 'virtual_seconds', args.target)}")


def reached(rounds: list[dict], clock: str, target: float) -> str:
    at = next((float(r[clock]) for r in rounds if float(r["accuracy"]) >= target), None)
    return "never" if at is None else f"{at:.0f} s"


def tune_run(spec: FleetSpec, setting: str, budget: float) -> tuple[dict, list[dict]]:
    """The replayed fleet for the recorded run's time, with these scheduler settings."""
    from edgesched.config import parse_scheduler_keys
    from edgesched.simulations.fleet_run import simulate_fleet

    out = Path(tempfile.mkdtemp(prefix="replay-"))
    summary = simulate_fleet(spec.with_overrides(strategy="edgesched", rounds=10_000, time_budget=budget,
                                                 scheduler=parse_scheduler_keys(setting)), out / "run",
                             engine="in-process")
    return summary, list(csv.DictReader((out / "run" / "rounds.csv").open()))

if __name__ == "__main__":
    main()
