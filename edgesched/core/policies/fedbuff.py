"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation, a benchmark baseline.

No rounds to wait for: up to `concurrency` devices train at any time, each on the newest model
when it starts, with the run's fixed local epochs. Every update that arrives goes into a
buffer; once `k` are in, the server takes one step, the mean of the buffered deltas each
weighted by its staleness (1 + s) ** -exponent, s being the number of server steps since its
job started. A step in the results is one server step. Devices are drawn at random, seeded,
from those online and free; a job whose device vanished (its Last Will, or a new agent
session) frees its slot.

Free slots are filled at each wake-up from what the server knew before it: a device whose job
ended at this very wake-up gets new work at the next one, or right after a server step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np

from edgesched.core.aggregate import apply_step, staleness_weight
from edgesched.core.decisions import Decision
from edgesched.core.engine import Job, Loss, Outcome, Wake, Weights
from edgesched.core.transport import Batch, FleetView, Order, Reply, Transport


class FedBuff:
    def __init__(self, k: int, concurrency: int, staleness_exponent: float, server_lr: float, round_timeout: float,
                 rng: np.random.Generator) -> None:
        self.k = k
        self.concurrency = concurrency
        self.staleness_exponent = staleness_exponent
        self.server_lr = server_lr
        self.round_timeout = round_timeout
        self.rng = rng
        self.log: list[Decision] = []  # a baseline keeps no decision log
        self._buffer: list[tuple[Weights, int]] = []  # (delta, staleness)
        self._ended: list[str] = []  # devices whose jobs ended since the last decision
        self._give_up = 0.0

    def begin_step(self, step: int, now: float) -> None:
        self._buffer = []
        self._give_up = now + self.round_timeout

    def dispatch(self, now: float, fleet: FleetView, transport: Transport, jobs: Mapping[str, Job]) -> Batch | None:
        busy = {job.device for job in jobs.values()} | set(self._ended)
        free = sorted(v.device for v in fleet.views(now) if v.device not in busy)
        room = min(self.concurrency - len(jobs) - len(self._ended), len(free))
        self._ended = []
        if room <= 0:
            return None
        return Batch([Order(str(device)) for device in sorted(self.rng.choice(free, size=room, replace=False))])

    def on_sent(self, job: Job, now: float) -> None:
        """Nothing to remember beyond what the engine keeps."""

    def on_reply(self, job: Job, reply: Reply, base: Weights, staleness: int, now: float) -> Outcome:
        assert reply.trained is not None
        self._ended.append(job.device)
        self._buffer.append(([b - t for b, t in zip(base, reply.trained, strict=True)], staleness))
        return "counted"

    def on_lost(self, job: Job, now: float, loss: Loss, detail: str) -> None:
        self._ended.append(job.device)

    def ready(self, now: float, jobs: Mapping[str, Job]) -> bool:
        return len(self._buffer) >= self.k or now >= self._give_up

    def wake(self, now: float, transport: Transport) -> Wake:
        return Wake(min(self._give_up, now + max(1.0, self.round_timeout / 100)))

    def close_step(self, now: float, jobs: Mapping[str, Job]) -> list[str]:
        return []

    def aggregate(self, model: Weights, now: float) -> tuple[Weights, int]:
        buffer = self._buffer
        if not buffer:
            return model, 0
        scale = [staleness_weight(s, self.staleness_exponent) / len(buffer) for _, s in buffer]
        step = [cast(np.ndarray, sum(c * d[i] for (d, _), c in zip(buffer, scale, strict=True)))
                for i in range(len(model))]
        return apply_step(model, step, self.server_lr), len(buffer)

    def after_step(self, step: int, now: float, loss: float, accuracy: float) -> None:
        """FedBuff has no feedback."""

