"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation, a benchmark baseline.

No rounds to wait for: up to `concurrency` devices train at any time, each on the newest model
when it starts, with the run's fixed local epochs. Every update that arrives goes into a
buffer; once `K` (the run's clients per round) are in, the server takes one step, the mean of
the buffered deltas each weighted by its staleness (1 + s) ** -exponent, s being the number of
server steps since its job started. A "round" in the results is one server step. Concurrency
is K x max-overselect, the most jobs edgesched itself may have in flight; devices are drawn at
random, seeded, from those online and free. A job whose device vanished (its Last Will, or a
new agent session) frees its slot at once, as in edgesched's loop.
"""

from __future__ import annotations

import math
import time

import numpy as np
from flwr.serverapp import Grid

from edgesched.aggregate import staleness_weight
from edgesched.config import RunConfig
from edgesched.results import JobRecord, RoundCallback, RoundRecord
from edgesched.server.federation import FederationResult, job_record, mean_train_loss
from edgesched.server.semi_async import (
    Clock,
    Evaluate,
    FleetView,
    model_record,
    push_job,
    trained_delta,
    vanished,
)


def run_fedbuff(grid: Grid, clock: Clock, fleet: FleetView, cfg: RunConfig, weights: dict[str, np.ndarray],
                evaluate: Evaluate, on_round: RoundCallback) -> FederationResult:
    rng = np.random.default_rng(cfg.seed)
    k = cfg.clients_per_round
    concurrency = math.ceil(k * cfg.max_overselect)
    keys, current = list(weights), list(weights.values())
    versions = {0: current}  # server step -> the model jobs started from then
    flights: dict[str, tuple[str, int, int | None]] = {}  # job id -> (device, step it started at, session)
    history: list[RoundRecord] = []
    started = time.monotonic()
    for rnd in range(1, cfg.rounds + 1):
        buffer: list[tuple[list[np.ndarray], int]] = []
        jobs: list[JobRecord] = []
        sent = lost = 0
        give_up = clock.now() + cfg.round_timeout
        while True:
            now = clock.now()
            busy = {device for device, _, _ in flights.values()}
            free = sorted(v.device for v in fleet.views(now) if v.device not in busy)
            room = min(concurrency - len(flights), len(free))
            if room > 0:
                arrays = model_record(keys, current)
                for device in sorted(rng.choice(free, size=room, replace=False)):
                    node, partition = fleet.target(device)
                    pushed = push_job(grid, arrays, cfg, rnd, node, partition)
                    if pushed:
                        flights[pushed[0]] = (device, rnd - 1, fleet.session(device, now))
                        sent += 1
            for reply in grid.pull_messages(list(flights)):
                _, step, _ = flights.pop(reply.metadata.reply_to_message_id)
                delta = trained_delta(reply, versions[step])
                if delta is None:
                    lost += 1
                    continue
                buffer.append((delta, rnd - 1 - step))
                jobs.append(job_record(rnd, reply))
            for job_id, (device, _, session) in list(flights.items()):
                if vanished(fleet, device, session, clock.now()):
                    del flights[job_id]
                    lost += 1
            if len(buffer) >= k or clock.now() >= give_up:
                break
            clock.wait(min(give_up, clock.now() + max(1.0, cfg.round_timeout / 100)))
        if buffer:
            scale = [staleness_weight(s, cfg.staleness_exponent) / len(buffer) for _, s in buffer]
            step = [sum(c * d[i] for (d, _), c in zip(buffer, scale, strict=True)) for i in range(len(current))]
            current = [(w.astype(np.float64) - cfg.server_lr * s).astype(w.dtype)
                       for w, s in zip(current, step, strict=True)]
        versions[rnd] = current
        for old in [v for v in versions if v != rnd and all(step != v for _, step, _ in flights.values())]:
            del versions[old]
        clock.mark("round_end", round=rnd, delivered=len(buffer))
        loss, accuracy = evaluate(current)
        record = RoundRecord(
            round=rnd, accuracy=accuracy, loss=loss, train_loss=mean_train_loss(jobs), selected=sent,
            replied=len(buffer), failed=lost, samples=sum(j.samples for j in jobs),
            seconds=time.monotonic() - started, virtual_seconds=clock.now() if clock.virtual else None,
        )
        history.append(record)
        on_round(record, jobs, dict(zip(keys, current, strict=True)))
    return FederationResult(dict(zip(keys, current, strict=True)), history)
