"""The run directory: resolved config, per-round and per-job metrics, summary, weights, plot.

Rows are appended and flushed as rounds finish, so a long run can be watched (or plotted)
while it goes, and an interrupted run keeps what it had.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from edgesched.core.decisions import Arrived, Decision, Expired, Lost, RoundPlanned
from edgesched.core.records import JobRecord, Model, RoundRecord
from edgesched.errors import ConfigError

T = TypeVar("T")


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
        if (out_dir / "summary.json").exists():
            raise ConfigError(f"{out_dir} already holds a finished run; choose another --out")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
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

    def offsets(self) -> dict[str, int]:
        """Bytes written to each log so far: where a resumed run continues them."""
        return {"rounds.csv": self._round_csv.tell(), "jobs.csv": self._job_csv.tell()}

    def on_round(self, record: RoundRecord, jobs: list[JobRecord], model: Model) -> None:
        if self._onnx:
            from edgesched.export import to_onnx

            atomic_write(self.out_dir / "onnx" / f"round-{record.round:04d}.onnx", to_onnx(self._onnx, model))
        self.rounds.append(record)
        self._round_csv.write(record)
        for job in jobs:
            self._job_csv.write(job)

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
        return summary

    def _clients_trained(self) -> int:
        """Clients (data shards) with at least one update in the model. With data split by user,
        a user whose device was never reachable while the run went on is missing from the model,
        however fast the run was. Read back from jobs.csv, so a resumed run counts all its jobs."""
        with (self.out_dir / "jobs.csv").open(newline="") as f:
            return len({row["partition"] for row in csv.DictReader(f)})

    def write_decisions(self, log: list[Decision]) -> None:
        """The scheduler's decision log as decisions.jsonl, and its picture as decisions.png
        (a policy that keeps no log writes neither)."""
        if not log:
            return
        with (self.out_dir / "decisions.jsonl").open("w") as f:
            for decision in log:
                f.write(decision.to_json() + "\n")
        plot_decisions(log, self.out_dir / "decisions.png")


def open_log(path: Path, resume_at: int | None = None, newline: str | None = None) -> IO[str]:
    """A log file to append to: new, or cut back to `resume_at` bytes (what a checkpoint saw)."""
    if resume_at is None:
        return path.open("w", newline=newline)
    f = path.open("r+", newline=newline)
    f.truncate(resume_at)
    f.seek(resume_at)
    return f


def atomic_write(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` so that a crash at any instant leaves the old file or the new
    one, never a torn one: write a temporary file, fsync it, rename it over, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_checkpoint(path: Path, state: object) -> None:
    """Pickle `state` to `path` atomically."""
    atomic_write(path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def read_checkpoint(path: Path, kind: type[T]) -> T:
    """The `kind` pickled at `path`; a one-line error for a damaged or foreign file, or one of
    another checkpoint format (`kind.format`: raised whenever a pickled class changes).

    A checkpoint is a pickle: read only those you trust, as with any pickle."""
    try:
        state = pickle.loads(path.read_bytes())
    except Exception as exc:  # a foreign or damaged file: say so in one line
        raise ConfigError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(state, kind):
        raise ConfigError(f"{path}: not a {kind.__name__} of this version of edgesched")
    # The instance's own field, not the class default a pickle from before the field would show.
    written, reads = vars(state).get("format"), getattr(kind, "format", None)
    if written != reads:
        raise ConfigError(f"{path}: written by another version of edgesched (checkpoint format {written}, "
                          f"this version reads {reads})")
    return state


def prediction_error(log: list[Decision], after_round: int = 0) -> dict[str, Any]:
    """Median absolute % error of predicted vs actual job time, over on-time arrivals after a round."""
    errors = [abs(e.error) for e in log if isinstance(e, Arrived) and e.staleness == 0 and e.round > after_round]
    return {"after_round": after_round, "jobs": len(errors),
            "median_abs_pct": round(100 * float(np.median(errors)), 2) if errors else None}


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


def plot_accuracy(rounds: list[RoundRecord], path: Path, virtual_time: bool = False) -> None:
    """Test accuracy and loss of the global model per round (or per virtual hour), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = [(r.virtual_seconds or 0.0) / 3600 if virtual_time else r.round for r in rounds]
    fig, acc_ax = plt.subplots(figsize=(7, 4), dpi=110)
    acc_ax.plot(x, [100 * r.accuracy for r in rounds], "o-", color="tab:blue", label="test accuracy")
    if virtual_time:
        acc_ax.set_xlabel("virtual time (hours)")
    else:
        acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        acc_ax.set_xlabel("round")
    acc_ax.set_ylabel("test accuracy (%)", color="tab:blue")
    acc_ax.grid(alpha=0.3)
    loss_ax = acc_ax.twinx()
    loss_ax.plot(x, [r.loss for r in rounds], "s--", color="tab:red", alpha=0.7, label="test loss")
    loss_ax.set_ylabel("test loss", color="tab:red")
    acc_ax.set_title("global model on the held-out test set")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_decisions(log: list[Decision], path: Path) -> None:
    """Three panels: predicted vs actual job time; per round the deadline and what became of
    the jobs; the prediction error per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arrived = [e for e in log if isinstance(e, Arrived)]
    rounds = [e for e in log if isinstance(e, RoundPlanned)]
    fig, (ax_pred, ax_round, ax_err) = plt.subplots(1, 3, figsize=(14, 4), dpi=110)
    if arrived:
        actual = [e.actual_s for e in arrived]
        ax_pred.scatter(actual, [e.predicted_s for e in arrived], s=6, alpha=0.5, c=[e.round for e in arrived],
                        cmap="viridis")
        both = actual + [e.predicted_s for e in arrived]
        low, top = max(min(both), 1e-3), max(both)
        ax_pred.plot([low, top], [low, top], color="grey", linewidth=0.8)
        ax_pred.set(xscale="log", yscale="log")
    ax_pred.set(xlabel="actual job time (s)", ylabel="planned (upper-quantile) time (s)",
                title="prediction vs outcome (colour: round)")
    by_round: dict[int, dict[str, int]] = {}
    for e in log:
        if isinstance(e, Arrived | Lost | Expired):
            counts = by_round.setdefault(e.arrived_round, {})
            outcome = e.to_dict()["outcome"]
            counts[outcome] = counts.get(outcome, 0) + 1
    xs = sorted({r.round for r in rounds})
    deadline = {r.round: r.deadline_s for r in rounds}
    bottom = np.zeros(len(xs))
    for outcome, colour in (("counted", "tab:green"), ("too_stale", "tab:orange"), ("expired", "tab:purple"),
                            ("lost", "tab:red")):
        heights = np.array([by_round.get(x, {}).get(outcome, 0) for x in xs], dtype=float)
        ax_round.bar(xs, heights, bottom=bottom, color=colour, label=outcome)
        bottom += heights
    ax_round.set(xlabel="round", ylabel="jobs ending in the round", title="jobs and deadline per round")
    ax_round.legend(fontsize=7, loc="upper left")
    ax_dl = ax_round.twinx()
    ax_dl.plot(xs, [deadline[x] for x in xs], "k.-", linewidth=0.8)
    ax_dl.set_ylabel("deadline (s)")
    errors: dict[int, list[float]] = {}
    for e in arrived:
        if e.staleness == 0:
            errors.setdefault(e.round, []).append(100 * abs(e.error))
    ex = sorted(errors)
    ax_err.plot(ex, [float(np.median(errors[x])) for x in ex], "o-", color="tab:blue")
    ax_err.set(xlabel="round", ylabel="median |error| (%)", title="job-time prediction error")
    ax_err.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
