"""Policies on the engine: when to send work to whom, and when and how to take a server step.

`fedavg` (synchronous rounds; with over-selection and a fixed deadline, the `deadline`
baseline), `fedbuff` (buffered asynchronous steps) and `edgesched` (the adaptive scheduler)
are built here from a run's configuration.
"""

from __future__ import annotations

import math

import numpy as np

from edgesched.config import RunConfig
from edgesched.core.plan import PlanConfig
from edgesched.core.policies.edgesched import EdgeschedPolicy
from edgesched.core.policies.fedavg import FedAvg
from edgesched.core.policies.fedbuff import FedBuff
from edgesched.core.predict import Predictor
from edgesched.core.risk import DropoutModel
from edgesched.core.scheduler import Scheduler, SchedulerConfig
from edgesched.core.validate import GuardConfig

Policy = EdgeschedPolicy | FedAvg | FedBuff


def fedavg(cfg: RunConfig, per_round: int | None = None, timeout: float | None = None,
           flower_sum: bool = False) -> FedAvg:
    return FedAvg(per_round or cfg.clients_per_round, cfg.round_timeout if timeout is None else timeout,
                  np.random.default_rng(cfg.seed), flower_sum)


def fedbuff(cfg: RunConfig) -> FedBuff:
    k = cfg.clients_per_round
    return FedBuff(k, math.ceil(k * cfg.max_overselect), cfg.staleness_exponent, cfg.server_lr, cfg.round_timeout,
                   np.random.default_rng(cfg.seed))


def edgesched(cfg: RunConfig, predictor: Predictor, risk: DropoutModel | None = None) -> EdgeschedPolicy:
    scheduler = Scheduler(scheduler_config(cfg), predictor, risk)
    return EdgeschedPolicy(scheduler, cfg.round_timeout, cfg.min_round_share)


def scheduler_config(cfg: RunConfig) -> SchedulerConfig:
    """The scheduler's settings from the run config's kebab-case knobs."""
    cfg = cfg.resolved()
    plan = PlanConfig(
        target_updates=cfg.clients_per_round, batch_size=cfg.batch_size, max_overselect=cfg.max_overselect,
        min_epochs=cfg.min_epochs, max_epochs=cfg.max_epochs or 1, deadline_quantile=cfg.deadline_quantile,
        deadline_epochs=float(cfg.local_epochs or 1),
        min_deadline_s=cfg.min_deadline, max_deadline_s=cfg.round_timeout, max_staleness=cfg.max_staleness,
        staleness_exponent=cfg.staleness_exponent, fairness_rounds=cfg.fairness_rounds,
        gateway_bytes_per_s=cfg.gateway_mbps * 1e6 / 8 if cfg.gateway_mbps > 0 else math.inf,
    )
    guard = GuardConfig(norm_limit=cfg.update_norm_limit, on_large_norm=cfg.large_update)
    return SchedulerConfig(plan=plan, server_lr=cfg.server_lr, battery_reserve=cfg.battery_reserve, guard=guard,
                           robust=cfg.robust_aggregation)
