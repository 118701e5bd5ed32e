"""Benchmark: how long the adaptive scheduler takes to plan a round for a large registry.

Builds a registry-like view of N devices (boards and phones with heartbeats, batteries and
learned speeds), then times `Scheduler.plan` over several rounds, with jobs dispatched and
finished in between so the predictor and risk model hold real per-device state.

    python -m benchmarks.plan --devices 1000 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgesched.config import RunConfig
from edgesched.core.engine import Job
from edgesched.core.fleet import DeviceView
from edgesched.core.policies import scheduler_config
from edgesched.core.predict import Predictor
from edgesched.core.scheduler import Scheduler
from edgesched.core.telemetry import Heartbeat

BOARDS = {"rpi4": 1.15e-3, "rpi5": 6.1e-4, "jetson-nano": 4.3e-4, "phone-low": 6.2e-3, "phone-mid": 1.4e-3}


def fleet_views(n: int, rng: np.random.Generator, now: float) -> list[DeviceView]:
    names = list(BOARDS)
    views = []
    for i in range(n):
        board = names[i % len(names)]
        phone = board.startswith("phone")
        hb = Heartbeat(device_id=f"d{i}", session=1, seq=int(now) + 1, sent_at=now,
                       cpu_percent=float(rng.uniform(0, 60)), load1=1.0, mem_available_mb=1500.0, mem_total_mb=4000.0,
                       battery_percent=float(rng.uniform(5, 100)) if phone else None,
                       charging=bool(rng.random() < 0.3) if phone else None,
                       net_type="cellular" if phone else "wifi", rtt_ms=float(rng.uniform(5, 200)))
        views.append(DeviceView(f"d{i}", int(rng.integers(60, 3000)), hb, board,
                                float(rng.uniform(0.001, 0.02)) if phone else None))
    return views


def bench(n: int, rounds: int, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    cfg = RunConfig.from_mapping({"clients": n, "fraction-train": min(1.0, 100 / n)})
    scheduler = Scheduler(scheduler_config(cfg), Predictor(861_480, BOARDS))
    seconds = []
    now = 0.0
    for rnd in range(1, rounds + 1):
        views = fleet_views(n, rng, now)
        start = time.perf_counter()
        plan = scheduler.plan(rnd, now, views)
        seconds.append(time.perf_counter() - start)
        by_id = {v.device: v for v in views}
        jobs = [Job(f"{rnd}-{k}", a.device, rnd, None, now, scheduler.dispatched(a, by_id[a.device].heartbeat))
                for k, a in enumerate(plan)]
        for job, a in zip(jobs, plan, strict=True):  # every job ends within the round: learned state grows
            if rng.random() < 0.2:
                scheduler.lost(job, now + 1, "dropout")
            else:
                scheduler.arrived(job, now + a.predicted_s * rng.uniform(0.6, 1.2), [np.zeros(1)], [np.zeros(1)],
                                  a.steps, a.samples, a.samples, a.predicted_s * 0.5, float(rng.uniform(0.3, 2)))
        scheduler.close_round([np.zeros(1)], now)
        now += 60.0
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'devices':>8} {'median s':>9} {'max s':>7}  (Scheduler.plan, {args.rounds} rounds, 100 wanted per round)")
    for n in args.devices:
        seconds = bench(n, args.rounds)
        print(f"{n:>8} {statistics.median(seconds):>9.3f} {max(seconds):>7.3f}")


if __name__ == "__main__":
    main()
