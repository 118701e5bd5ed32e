"""The run directory: resolved config, per-round and per-job metrics, summary, weights, plot.

Rows are appended and flushed as rounds finish, so a long run can be watched (or plotted)
while it goes, and an interrupted run keeps what it had.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any

import numpy as np

from edgesched.core.decisions import Decision
from edgesched.core.records import JobRecord, Model, RoundRecord
from edgesched.errors import ConfigError
from edgesched.files import atomic_write, hold_lock, open_log
from edgesched.observe import FLEET_FILE, LOCK_FILE
from edgesched.plots import plot_accuracy, plot_decisions

FLEET_EVERY_S = 1.0  # between steps, fleet.json is rewritten at most this often (wall clock)
FLEET_COST_SHARE = 9.0  # ... and after a pause this many times as long as its last write took


class RunRecorder:
    """Writes a run directory as the run goes; `finish` adds the summary, weights and plot.

    With the config's `onnx-every-round`, each round's global model is also written as
    `onnx/round-NNNN.onnx`, so boards that only infer can take the newest model while the run
    goes on (edgesched.export; about 0.2 s a round for the Fashion-MNIST CNN).
    """

    def __init__(self, out_dir: Path, config: dict[str, Any], resume: dict[str, int] | None = None,
                 rounds: list[RoundRecord] | None = None) -> None:
        """`resume`: the logs' sizes at a checkpoint (`offsets()`); they are cut back to them
        and continued, after `rounds`, the rounds recorded by then."""
        _refuse_finished(out_dir)
        _make_run_dir(out_dir)
        self._lock: IO[bytes] | None = hold_lock(out_dir / LOCK_FILE,
                                                 f"{out_dir}: another process is writing a run there; "
                                                 "choose another --out")
        self.out_dir = out_dir
        try:
            _refuse_finished(out_dir)  # again: a run that finished while the lock was being taken
        except ConfigError:
            self._release()
            raise
        self._onnx = config["dataset"] if config.get("onnx-every-round") else None
        if self._onnx:
            from edgesched.export import require

            require("onnx")  # before the run starts, not after its first round
            (out_dir / "onnx").mkdir(exist_ok=True)
        self.rounds: list[RoundRecord] = list(rounds or [])
        if resume is None:
            (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self._round_csv = _CsvLog(out_dir / "rounds.csv", RoundRecord, resume and resume["rounds.csv"])
        self._job_csv = _CsvLog(out_dir / "jobs.csv", JobRecord, resume and resume["jobs.csv"])
        self._decisions: IO[str] | None = None  # decisions.jsonl, opened at the first decision
        self._decided = 0  # decisions written
        self._fleet_at = -float("inf")  # when fleet.json may next be written between steps (monotonic)
        if resume and resume.get("decisions.jsonl"):
            self._decisions = open_log(out_dir / "decisions.jsonl", resume["decisions.jsonl"])
            with (out_dir / "decisions.jsonl").open() as f:
                self._decided = sum(1 for _ in f)

    def offsets(self) -> dict[str, int]:
        """Bytes written to each log so far: where a resumed run continues them."""
        return {"rounds.csv": self._round_csv.tell(), "jobs.csv": self._job_csv.tell(),
                "decisions.jsonl": self._decisions.tell() if self._decisions else 0}

    def on_round(self, record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
        if self._onnx:
            from edgesched.export import to_onnx

            atomic_write(self.out_dir / "onnx" / f"round-{record.round:04d}.onnx", to_onnx(self._onnx, model))
        self.rounds.append(record)
        self._round_csv.write(record)
        for job in jobs:
            self._job_csv.write(job)

    def write_fleet(self, record: Callable[[], dict[str, Any]], settled: bool = True) -> None:
        """fleet.json (edgesched.observe.fleet_record): after every step (`settled`) and, while
        one goes on, at most every FLEET_EVERY_S, so the fleet can be watched at a few seconds' lag
        for the cost of one small file a second. A large fleet's file costs more (100,000 devices:
        28 MB, seconds to write): the pause after a write is then FLEET_COST_SHARE times longer
        than the write took, so watching never takes more than a tenth of the run."""
        now = time.monotonic()
        if settled or now >= self._fleet_at:
            atomic_write(self.out_dir / FLEET_FILE, json.dumps(record()).encode())
            done = time.monotonic()
            self._fleet_at = done + max(FLEET_EVERY_S, (done - now) * FLEET_COST_SHARE)

    def finish(self, weights: dict[str, np.ndarray], extra: dict[str, Any]) -> dict[str, Any]:
        np.savez(self.out_dir / "model.npz", **weights)
        self._round_csv.close()
        self._job_csv.close()
        last = self.rounds[-1] if self.rounds else None
        summary = {
            "final_accuracy": last.accuracy if last else None,
            "final_loss": last.loss if last else None,
            "best_accuracy": max((r.accuracy for r in self.rounds), default=None),
            "rounds": len(self.rounds),
            "failed_jobs": sum(r.failed for r in self.rounds),
            "clients_trained": self._clients_trained(),
            **extra,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self.rounds:
            plot_accuracy(self.rounds, self.out_dir / "accuracy.png")
        self._release()  # summary.json now refuses any other writer
        return summary

    def _release(self) -> None:
        """Give up the run directory, leaving no .lock behind."""
        if self._lock is not None:
            (self.out_dir / LOCK_FILE).unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def _clients_trained(self) -> int:
        """Clients (data shards) with at least one update in the model. With data split by user,
        a user whose device was never reachable while the run went on is missing from the model,
        however fast the run was. Read back from jobs.csv, so a resumed run counts all its jobs."""
        with (self.out_dir / "jobs.csv").open(newline="") as f:
            return len({row["partition"] for row in csv.DictReader(f)})

    def add_decisions(self, log: Sequence[Decision]) -> None:
        """Append the decisions made since the last call to decisions.jsonl, so that it grows as
        the run goes (`log`: the policy's whole log so far)."""
        if len(log) <= self._decided:
            return
        if self._decisions is None:
            self._decisions = (self.out_dir / "decisions.jsonl").open("w")
        for decision in log[self._decided:]:
            self._decisions.write(decision.to_json() + "\n")
        self._decisions.flush()
        self._decided = len(log)

    def write_decisions(self, log: list[Decision]) -> None:
        """The rest of the scheduler's decision log, and its picture as decisions.png (a policy
        that keeps no log writes neither)."""
        self.add_decisions(log)
        if self._decisions is not None:
            self._decisions.close()
        if log:
            plot_decisions(log, self.out_dir / "decisions.png")


def _refuse_finished(out_dir: Path) -> None:
    if (out_dir / "summary.json").exists():
        raise ConfigError(f"{out_dir} already holds a finished run; choose another --out")


def _make_run_dir(out_dir: Path) -> None:
    """Create `out_dir` (and the folders above it), or fail in one line naming it and why:
    a file of that name, a path through a file, no permission."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file of that name exists" if isinstance(exc, FileExistsError) else exc.strerror
        raise ConfigError(f"--out {out_dir}: cannot create the run directory ({why})") from None
    if not os.access(out_dir, os.W_OK):
        raise ConfigError(f"{out_dir}: cannot write to the run directory (Permission denied)")


class _CsvLog:
    def __init__(self, path: Path, row_type: type, resume_at: int | None = None) -> None:
        """A new CSV with its header, or (`resume_at`) an existing one cut back to that size."""
        self._file = open_log(path, resume_at, newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=[f.name for f in fields(row_type)])
        if resume_at is None:
            self._writer.writeheader()

    def tell(self) -> int:
        return self._file.tell()

    def write(self, row: Any) -> None:
        self._writer.writerow(asdict(row))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
