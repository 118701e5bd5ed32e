"""The synchronous federated round loop over Flower's Grid (Message API).

Per round: sample partitions with the run's seeded generator, send each chosen node a
message with its own ConfigRecord, wait for replies up to the round timeout, average the
replies in partition order (so the result does not depend on arrival order), and evaluate
the global model on the held-out test set.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from edgesched import data
from edgesched.aggregate import weighted_average
from edgesched.config import RunConfig
from edgesched.errors import EdgeschedError
from edgesched.jobs import ARRAYS, CONFIG, DEVICE, METRICS, job_config
from edgesched.mqtt import RegistryListener
from edgesched.results import JobRecord, RoundCallback, RoundRecord

log = logging.getLogger(__name__)
NODE_WAIT_SECONDS = 120.0


@dataclass(frozen=True)
class FederationResult:
    weights: dict[str, np.ndarray]
    rounds: list[RoundRecord]
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the adaptive scheduler's log


def run_federation(
    grid: Grid, cfg: RunConfig, on_round: RoundCallback, telemetry: RegistryListener | None = None
) -> FederationResult:
    """Run `cfg.rounds` rounds; with telemetry, join each reply's device id to its node id."""
    import torch

    from edgesched.models import build_model
    from edgesched.training import evaluate

    test = data.load(cfg.dataset, cfg.data_dir)
    model = build_model(cfg.dataset, cfg.seed)
    keys = list(model.state_dict())
    weights = [t.detach().numpy().copy() for t in model.state_dict().values()]
    nodes = wait_for_nodes(grid, cfg.clients or 1)
    rng = np.random.default_rng(cfg.seed)
    start = time.monotonic()
    history: list[RoundRecord] = []
    for rnd in range(1, cfg.rounds + 1):
        chosen = np.sort(rng.choice(cfg.clients, size=cfg.clients_per_round, replace=False))
        arrays = ArrayRecord({k: Array(w) for k, w in zip(keys, weights, strict=True)})
        messages = [
            Message(
                RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(job_config(cfg, rnd, int(pid)))}),
                dst_node_id=nodes[pid % len(nodes)],
                message_type=MessageType.TRAIN,
                group_id=str(rnd),
            )
            for pid in chosen
        ]
        replies = list(grid.send_and_receive(messages, timeout=cfg.round_timeout))
        good = sorted((r for r in replies if r.has_content()), key=lambda r: _metric(r, "partition-id"))
        jobs = [job_record(rnd, r) for r in good]
        if telemetry is not None:
            for job in jobs:
                telemetry.link_node(job.device_id, job.node_id)
        if good:
            weights = weighted_average(
                [r.content[ARRAYS].to_numpy_ndarrays() for r in good],
                [_metric(r, "num-examples") for r in good],
            )
        else:
            log.warning("round %d: no client replied in time; the model is unchanged", rnd)
        model.load_state_dict({k: torch.from_numpy(w) for k, w in zip(keys, weights, strict=True)})
        loss, accuracy = evaluate(model, test.x_test, test.y_test)
        record = RoundRecord(
            round=rnd,
            accuracy=accuracy,
            loss=loss,
            train_loss=mean_train_loss(jobs),
            selected=len(messages),
            replied=len(good),
            failed=len(messages) - len(good),
            samples=sum(j.samples for j in jobs),
            seconds=time.monotonic() - start,
        )
        history.append(record)
        on_round(record, jobs, dict(zip(keys, weights, strict=True)))
    return FederationResult(dict(zip(keys, weights, strict=True)), history)


def wait_for_nodes(grid: Grid, wanted: int) -> list[int]:
    """Block until the grid has nodes (all `wanted` or whatever came within the wait)."""
    deadline = time.monotonic() + NODE_WAIT_SECONDS
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or (nodes and time.monotonic() > deadline):
            return nodes
        if time.monotonic() > deadline:
            raise EdgeschedError(f"no client node connected within {NODE_WAIT_SECONDS:.0f} s")
        time.sleep(0.2)


def _metric(reply: Message, key: str) -> float:
    return float(reply.content[METRICS][key])


def job_record(rnd: int, reply: Message) -> JobRecord:
    """A ClientApp reply's report as a row of jobs.csv."""
    m = reply.content[METRICS]
    return JobRecord(
        round=rnd,
        partition=int(m["partition-id"]),
        node_id=reply.metadata.src_node_id,
        device_id=str(reply.content[DEVICE]["device-id"]),
        samples=int(m["samples"]),
        steps=int(m["steps"]),
        seconds=float(m["seconds"]),
        samples_per_second=float(m["samples-per-second"]),
        loss=float(m["loss"]),
    )


def mean_train_loss(jobs: list[JobRecord]) -> float:
    """The clients' training loss, weighted by the samples each trained."""
    weights = [j.samples for j in jobs]
    return float(np.average([j.loss for j in jobs], weights=weights)) if jobs and sum(weights) else float("nan")
