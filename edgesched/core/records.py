"""What a run records: one row per server step (rounds.csv) and per job that counted (jobs.csv).

Both are built here and nowhere else, so the engine and the Flower reference baselines write
the same columns with the same meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JobMetrics:
    """What a client reports of one job, every figure already checked to be a finite number."""

    partition: int
    samples: int  # samples trained (epochs x data, or fewer with a step cap)
    steps: int
    num_examples: int  # the client's data size: its share of the objective
    seconds: float  # compute time
    samples_per_second: float
    loss: float


@dataclass(frozen=True)
class RoundRecord:
    """One server step as the server saw it; `seconds` counts from the start of the run (wall
    clock), `virtual_seconds` from the start of a virtual fleet's run (None without one)."""

    round: int
    accuracy: float
    loss: float
    train_loss: float
    selected: int  # jobs sent during the step
    replied: int  # updates in the step's aggregate (late ones from earlier steps included)
    failed: int  # jobs that ended without a usable update during the step
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
    bits: int = 0  # the update's width (0: float32)
    bytes_down: int = 0  # model bytes the job carried to the device
    bytes_up: int = 0  # and its reply back


Model = Mapping[str, np.ndarray]  # the global model: parameter name -> weights
# Called after each step with its record, the jobs that counted in it, and the new global model.
RoundCallback = Callable[[RoundRecord, list[JobRecord], Model], None]


def job_record(step: int, node: int, device: str, metrics: JobMetrics, bits: int = 0,
               moved: tuple[int, int] = (0, 0)) -> JobRecord:
    """A job's report as a row of jobs.csv (`moved`: model bytes down and up)."""
    return JobRecord(round=step, partition=metrics.partition, node_id=node, device_id=device,
                     samples=metrics.samples, steps=metrics.steps, seconds=metrics.seconds,
                     samples_per_second=metrics.samples_per_second, loss=metrics.loss, bits=bits,
                     bytes_down=moved[0], bytes_up=moved[1])


def round_record(step: int, loss: float, accuracy: float, jobs: Sequence[JobRecord], selected: int, replied: int,
                 failed: int, seconds: float, virtual_seconds: float | None) -> RoundRecord:
    """A step's row of rounds.csv: the global model's test figures and what the step took in."""
    return RoundRecord(round=step, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(jobs),
                       selected=selected, replied=replied, failed=failed, samples=sum(j.samples for j in jobs),
                       seconds=seconds, virtual_seconds=virtual_seconds)


def mean_train_loss(jobs: Sequence[JobRecord]) -> float:
    """The clients' training loss, weighted by the samples each trained."""
    weights = [j.samples for j in jobs]
    return float(np.average([j.loss for j in jobs], weights=weights)) if jobs and sum(weights) else float("nan")
