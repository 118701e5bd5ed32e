"""Every strategy a virtual fleet can run, on the same virtual fleet, clock, data and seed.

- `fedavg`, `fedprox`: Flower's stock strategies, untouched, through a Grid on the virtual fleet
  (simulations.grid_face): a round waits for every sampled device or the round timeout.
  FedProx's clients add mu/2 ||w - w_global||^2 (`proximal-mu`). The reference baselines.
- The rest are policies on edgesched's engine (edgesched.core.policies):
  - `deadline`: FedAvg as production FL runs it (Bonawitz et al., 2019): 130 % of the wanted
    devices are sampled, and what has not arrived by a fixed deadline is dropped. The deadline
    is what an operator who knows the hardware would set: the 90 % quantile of the fleet's
    nominal job times (catalog speed, mean link), fixed for the run.
  - `fedbuff`: buffered asynchronous aggregation.
  - `edgesched`: the adaptive scheduler; its ablations switch one mechanism off:
    `edgesched-no-prediction` (catalog priors only, nothing learned from jobs or reported speeds),
    `edgesched-no-staleness` (an update that misses its round never counts),
    `edgesched-no-equal-finish` (every device does exactly FedAvg's epochs, fast or slow),
    `edgesched-no-churn` (departures between jobs neither raise risk nor shorten jobs),
    `edgesched-no-reserve` (a phone's battery may be trained flat, as the baselines do: no 20 %
    kept for its owner), `edgesched-no-absence` (a job that risks its device's absence carries no
    more epochs than one that does not: `absence-stretch = 1`, edgesched.core.plan),
    or set its pace: `edgesched-pace-NAME` (edgesched.core.pace: `rounds`, `stream`, FedBuff's
    pace over the planner, or `learned` in the run);
    `edgesched-no-calm` is the default of before: a streamed device whose update waits for the
    step is always held and the learned pace's blocks are six steps, however few jobs the fleet
    loses (`stream-hold = "always"`, `matched-spans = false`); edgesched prices the hold and
    matches spans while it loses under 5 %.
    `edgesched-early-step` adds one: a streamed step does not hold idle devices for an update
    that is far off (`early-step`, edgesched.core.policies.edgesched; it needs the hold always);
    `edgesched-matched-spans` holds always and judges each pace over as long a span as the
    other's, whatever the loss rate (`match-max-loss = 1`, edgesched.core.pace);
    `edgesched-eager-rounds`: a round does not wait for devices to come back online once every
    device online is free (`eager-rounds`, edgesched.core.policies.edgesched);
    `edgesched-step-fill`: a streamed job of a fast device trains on until the step it waits for
    is predicted instead of idling in the hold (`step-fill`, edgesched.core.scheduler);
    `edgesched-no-hold`: a streamed device whose update waits for the step is sent again at once,
    as FedBuff does, and spans are six steps (`stream-hold = "never"`, `matched-spans = false`);
    and `edgesched-priced` prices the hold however many jobs are lost (`priced-max-loss = 1`),
    with spans matched while the fleet loses under a fifth of its jobs (`match-max-loss = 0.2`);
    `edgesched-no-paced-staleness`: streamed staleness bounds per deadline, and a step of late
    updates moving the model as far as one of fresh ones (`paced-staleness`,
    edgesched.core.policies.edgesched and edgesched.core.aggregate.staleness_damping);
    `edgesched-loss-utility`: a device's value in the selection is its data times its last loss,
    not its data alone (`loss-utility`, edgesched.core.plan); `edgesched-loss-driven`: both, the
    scheduler's selection and streamed steps until 2026-12-04 (`edgesched-no-calm` keeps them too);
    `edgesched-error-reward`: the learned pace judges its blocks by the test error rate's fall,
    not the loss's (`pace-reward = "error"`, edgesched.core.pace); `edgesched-short-rounds`: where
    the fleet loses 5 % of its jobs or more, the learned pace plays rounds in blocks of three steps,
    not six (`lossy-rounds-steps = 3`).
  - `oracle`: edgesched's planner fed the true future instead of predictions (simulations.oracle).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgesched.config import PACE_CHOICES, RunConfig
from edgesched.core import policies
from edgesched.core.decisions import prediction_error
from edgesched.core.policies.edgesched import EdgeschedPolicy
from edgesched.core.predict import Predictor, PredictorConfig
from edgesched.core.records import RoundCallback, job_record, round_record
from edgesched.core.risk import DropoutModel, RiskConfig
from edgesched.flower.messages import decode_reply
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.clock import VirtualClock
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.grid_face import FlowerGridFace
from edgesched.simulations.oracle import Foresight, OraclePredictor, OracleRisk

Weights = dict[str, np.ndarray]
Evaluate = Callable[[list[np.ndarray]], tuple[float, float]]
FLOWER = ("fedavg", "fedprox")  # run by Flower's own Strategy.start
DEADLINE_OVERSELECT = 1.3
# Each ablation turns one mechanism off; without equal-finish work every device trains FedAvg's
# local epochs, however fast or slow it is.
# The scheduler's selection and streamed steps until 2026-12-04: devices valued by data x last loss,
# streamed steps undamped and their staleness bounds counted per deadline.
LOSS_DRIVEN = {"loss-utility": True, "paced-staleness": False}
ABLATIONS: dict[str, Callable[[RunConfig], dict[str, Any]]] = {
    "edgesched-no-staleness": lambda cfg: {"max-staleness": 0},
    "edgesched-no-reserve": lambda cfg: {"battery-reserve": 0.0},
    "edgesched-no-equal-finish": lambda cfg: {"min-epochs": float(cfg.training.local_epochs),
                                              "max-epochs": cfg.training.local_epochs},
    **{f"edgesched-pace-{name}": lambda cfg, name=name: {"pace": name} for name in PACE_CHOICES},
    "edgesched-early-step": lambda cfg: {"early-step": True, "stream-hold": "always"},
    "edgesched-matched-spans": lambda cfg: {"stream-hold": "always", "match-max-loss": 1.0},
    "edgesched-no-absence": lambda cfg: {"absence-stretch": 1.0},
    "edgesched-eager-rounds": lambda cfg: {"eager-rounds": True},
    "edgesched-step-fill": lambda cfg: {"step-fill": True},
    "edgesched-no-hold": lambda cfg: {"stream-hold": "never", "matched-spans": False},
    "edgesched-priced": lambda cfg: {"priced-max-loss": 1.0, "match-max-loss": 0.2},
    "edgesched-no-calm": lambda cfg: {"stream-hold": "always", "matched-spans": False, **LOSS_DRIVEN},
    "edgesched-loss-driven": lambda cfg: LOSS_DRIVEN,
    "edgesched-no-paced-staleness": lambda cfg: {"paced-staleness": False},
    "edgesched-loss-utility": lambda cfg: {"loss-utility": True},
    "edgesched-error-reward": lambda cfg: {"pace-reward": "error"},
    "edgesched-short-rounds": lambda cfg: {"lossy-rounds-steps": 3},
    "edgesched-compressed": lambda cfg: {"compression": "adaptive"},
    "edgesched-compressed-8": lambda cfg: {"compression": "8"},
}


def evaluator(cfg: RunConfig) -> tuple[Weights, Evaluate]:
    """(initial weights, evaluate(weights) -> (loss, accuracy) on the held-out test set)."""
    from edgesched.tasks import build_model, load_data
    from edgesched.training import scorer

    test = load_data(cfg.data.dataset, cfg.data.data_dir)
    model = build_model(cfg.data.dataset, cfg.seed)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, scorer(model, test.x_test,
                                                                                          test.y_test)


def make_policy(cfg: RunConfig, fleet: VirtualFleet, sizes: list[int], clock: VirtualClock) -> policies.Policy:
    """The engine's policy for `cfg.strategy` (not one of Flower's own)."""
    strategy = cfg.strategy
    if strategy == "deadline":
        per_round = math.ceil(cfg.clients_per_round * DEADLINE_OVERSELECT)
        return policies.fedavg(cfg, per_round, nominal_deadline(fleet, sizes, cfg), flower_sum=True)
    if strategy == "fedbuff":
        return policies.fedbuff(cfg)
    cfg = cfg.with_keys(ABLATIONS[strategy](cfg) if strategy in ABLATIONS else {})
    if strategy == "oracle":
        foresight = Foresight(fleet, sizes, clock)
        battery_reserve = policies.scheduler_config(cfg).battery_reserve
        return policies.edgesched(cfg, OraclePredictor(foresight, fleet.model_bytes),
                                  OracleRisk(foresight, battery_reserve))
    priors = {name: board.train_seconds(fleet.model_macs, 1) for name, board in load_catalog().boards.items()}
    learn = strategy != "edgesched-no-prediction"
    risk = None
    if strategy == "edgesched-no-churn":
        risk = DropoutModel(RiskConfig(battery_reserve=policies.scheduler_config(cfg).battery_reserve, churn=False))
    return policies.edgesched(cfg, Predictor(fleet.model_bytes, priors, PredictorConfig(learn=learn)), risk)


def summary_extra(cfg: RunConfig, policy: policies.Policy, fleet: VirtualFleet, sizes: list[int]) -> dict[str, Any]:
    """What summary.json adds for a policy: the deadline it kept, or how the scheduler predicted."""
    if cfg.strategy == "deadline":
        return {"deadline_s": round(nominal_deadline(fleet, sizes, cfg), 3)}
    if isinstance(policy, EdgeschedPolicy):
        guard = policy.scheduler.guard
        return {"prediction_error": prediction_error(policy.log, after_round=5),
                "refused_updates": dict(guard.refused), "clipped_updates": guard.clipped}
    return {}


def nominal_deadline(fleet: VirtualFleet, sizes: list[int], cfg: RunConfig, quantile: float = 0.9) -> float:
    """The quantile of the devices' nominal job times (one job's epochs of their data)."""
    epochs = cfg.training.local_epochs
    return float(np.quantile([fleet.nominal_job_s(i, epochs * n) for i, n in enumerate(sizes)], quantile))


class _BudgetSpent(Exception):
    """A round of Flower's strategy ended past the run's time budget: the run stops there."""


def run_flower(face: FlowerGridFace, cfg: RunConfig, weights: Weights, evaluate: Evaluate,
               on_round: RoundCallback) -> Weights:
    """Flower's own FedAvg or FedProx over the virtual fleet; returns the final weights. With a
    time budget, the run stops after the first round that ends past it (Flower's strategies run
    their rounds themselves: the evaluation callback is where a run can be told to stop)."""
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg, FedProx

    from edgesched.flower.messages import model_record

    started = time.monotonic()
    last = dict(weights)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = list(arrays.to_numpy_ndarrays())
        loss, accuracy = evaluate(model)
        last.update(zip(arrays.keys(), model, strict=True))
        if server_round > 0 and face.last is not None:
            out = face.last
            replies = [decode_reply(r, r.metadata.reply_to_message_id, math.inf) for r in out.replies]
            jobs = [job_record(server_round, r.node, r.device_claim or "", r.metrics) for r in replies
                    if r.metrics is not None]
            on_round(round_record(server_round, loss, accuracy, jobs, out.selected, out.delivered,
                                  out.dropped + out.late, time.monotonic() - started, out.ended_at),
                     jobs, dict(zip(arrays.keys(), model, strict=True)))
            if cfg.time_budget is not None and out.ended_at >= cfg.time_budget:
                raise _BudgetSpent
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    # The grid offers exactly the round's devices; the strategy takes them all.
    n = cfg.clients_per_round
    common = {"fraction_train": 1.0, "fraction_evaluate": 0.0, "min_train_nodes": n, "min_available_nodes": n}
    strategy = FedProx(proximal_mu=cfg.training.proximal_mu, **common) if cfg.strategy == "fedprox" \
        else FedAvg(**common)
    initial = model_record(list(weights), list(weights.values()))
    try:
        result = strategy.start(grid=face, initial_arrays=initial, num_rounds=cfg.rounds, timeout=cfg.round_timeout,
                                train_config=ConfigRecord({"lr": cfg.training.lr}), evaluate_fn=evaluate_fn)
    except _BudgetSpent:
        return last
    return {k: v.numpy() for k, v in result.arrays.to_torch_state_dict().items()}
