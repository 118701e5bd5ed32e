"""The run directory: resolved config, per-round and per-job metrics, summary, weights, plot.

Rows are appended and flushed as rounds finish, so a long run can be watched (or plotted)
while it goes, and an interrupted run keeps what it had.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from edgesched.errors import ConfigError


@dataclass(frozen=True)
class RoundRecord:
    """One round as the server saw it; `seconds` counts from the start of the run (wall
    clock), `virtual_seconds` from the start of a virtual fleet's run (None without one)."""

    round: int
    accuracy: float
    loss: float
    train_loss: float
    selected: int
    replied: int
    failed: int
    samples: int
    seconds: float
    virtual_seconds: float | None = None


@dataclass(frozen=True)
class JobRecord:
    """One client job's report: the raw observations a performance model learns from."""

    round: int
    partition: int
    node_id: int
    device_id: str
    samples: int
    steps: int
    seconds: float
    samples_per_second: float
    loss: float


class RunRecorder:
    """Writes a run directory as the run goes; `finish` adds the summary, weights and plot."""

    def __init__(self, out_dir: Path, config: dict[str, Any]) -> None:
        if (out_dir / "summary.json").exists():
            raise ConfigError(f"{out_dir} already holds a finished run; choose another --out")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.rounds: list[RoundRecord] = []
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self._round_csv = _CsvLog(out_dir / "rounds.csv", RoundRecord)
        self._job_csv = _CsvLog(out_dir / "jobs.csv", JobRecord)

    def on_round(self, record: RoundRecord, jobs: list[JobRecord]) -> None:
        self.rounds.append(record)
        self._round_csv.write(record)
        for job in jobs:
            self._job_csv.write(job)

    def finish(self, weights: dict[str, np.ndarray], extra: dict[str, Any]) -> dict[str, Any]:
        np.savez(self.out_dir / "model.npz", **weights)
        last = self.rounds[-1] if self.rounds else None
        summary = {
            "final_accuracy": last.accuracy if last else None,
            "final_loss": last.loss if last else None,
            "best_accuracy": max((r.accuracy for r in self.rounds), default=None),
            "rounds": len(self.rounds),
            "failed_jobs": sum(r.failed for r in self.rounds),
            **extra,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self._round_csv.close()
        self._job_csv.close()
        if self.rounds:
            plot_accuracy(self.rounds, self.out_dir / "accuracy.png")
        return summary


class _CsvLog:
    def __init__(self, path: Path, row_type: type) -> None:
        self._file = path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=[f.name for f in fields(row_type)])
        self._writer.writeheader()

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
