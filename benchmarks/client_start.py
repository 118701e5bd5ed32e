"""Benchmark: what one job costs a board before and beside its training.

A deployed SuperNode starts a new ClientApp process for every message, so every job pays
Python's start, the imports and the data set again. This runs, each in a fresh process as a
board would, and `--repeat` times (the median is printed):

- `query`: the gateway asking which device a node is (no torch, no data);
- `train, cold`: a training job whose partition is not yet cached: it decodes the whole data
  set and splits it;
- `train, cached`: the same job once the board keeps its partition decoded on disk;

and, to say what dominates, the bare imports (flwr + the ClientApp; torch) and the data set's
decoding alone. Figures of the same run compare; the machine's noise cancels in the ratios.

    python -m benchmarks.client_start --dataset fmnist --clients 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import time
from flwr.app import ArrayRecord, ConfigRecord, Context, Metadata, RecordDict
from flwr.app.message.message import make_message
from edgesched.clients.app import app
from edgesched.config import RunConfig
from edgesched.flower.messages import job_config
content = RecordDict()
if "{kind}" == "train":
    from edgesched.tasks import build_model
    cfg = RunConfig.from_mapping({{"dataset": "{dataset}", "clients": {clients}, "local-epochs": 1}})
    content = RecordDict({{"arrays": ArrayRecord(build_model("{dataset}").state_dict()),
                          "config": ConfigRecord({{**job_config(cfg, 1, 0), "max-steps": 1}})}})
metadata = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="1",
                    created_at=time.time(), ttl=600, message_type="{kind}")
context = Context(run_id=1, node_id=7, node_config={{"device-id": "bench"}}, state=RecordDict(), run_config={{}})
assert not app(make_message(metadata, content), context).has_error()
"""


def timed(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks.client_start: a job failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fmnist", choices=("fmnist", "digits"))
    parser.add_argument("--clients", type=int, default=10, help="partitions the data set is split into")
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per measure (median printed)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.clients < 1:
        parser.error("--repeat and --clients must be at least 1")
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "EDGESCHED_STATE_DIR": state, "FLWR_TELEMETRY_ENABLED": "0"}
        job = {kind: JOB.format(kind=kind, dataset=args.dataset, clients=args.clients) for kind in ("query", "train")}
        cache = Path(state) / "edgesched" / "partitions"

        def cold() -> float:
            for path in cache.glob("*.npz"):
                path.unlink()
            return timed(job["train"], env)

        measures = {
            "python alone": lambda: timed("pass", env),
            "import flwr + the ClientApp": lambda: timed("import edgesched.clients.app", env),
            "import torch": lambda: timed("import torch", env),
            f"decode {args.dataset}": lambda: timed(f"from edgesched import data; data.load('{args.dataset}')", env),
            "query job": lambda: timed(job["query"], env),
            "train job (1 step), cold": cold,
            "train job (1 step), cached": lambda: timed(job["train"], env),
        }
        medians = {}
        for name, measure in measures.items():
            medians[name] = statistics.median(measure() for _ in range(args.repeat))
            print(f"{name:32} {medians[name]:6.2f} s", flush=True)
    gain = medians["train job (1 step), cold"] / medians["train job (1 step), cached"]
    print(f"cached over cold: {gain:.2f}x faster per job")


if __name__ == "__main__":
    main()
