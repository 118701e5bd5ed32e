"""Policies on the engine: when to send work to whom, and when and how to take a server step.

`fedavg` (synchronous rounds; with over-selection and a fixed deadline, the `deadline`
baseline), `fedbuff` (buffered asynchronous steps) and `edgesched` (the adaptive scheduler)
are built here from a run's configuration.
"""

from __future__ import annotations

import math

import numpy as np

from edgesched.config import RunConfig, SchedulerSettings
from edgesched.core.feedback import FeedbackConfig
from edgesched.core.pace import PACES, BanditConfig, FixedPacer, LearnedPacer
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
    s = cfg.scheduler
    return FedBuff(k, math.ceil(k * s.max_overselect), s.staleness_exponent, s.server_lr, cfg.round_timeout,
                   np.random.default_rng(cfg.seed))


def edgesched(cfg: RunConfig, predictor: Predictor, risk: DropoutModel | None = None) -> EdgeschedPolicy:
    scheduler = Scheduler(scheduler_config(cfg), predictor, risk)
    return EdgeschedPolicy(scheduler, cfg.round_timeout, cfg.scheduler.min_round_share, pacer(cfg.scheduler),
                           early_step=cfg.scheduler.early_step, eager_rounds=cfg.scheduler.eager_rounds,
                           stream_hold=cfg.scheduler.stream_hold, priced_max_loss=cfg.scheduler.priced_max_loss,
                           paced_staleness=cfg.scheduler.paced_staleness)


def pacer(s: SchedulerSettings) -> FixedPacer | LearnedPacer:
    """The pacer the run's `pace` setting names: one pace throughout, or a pace learned in the run."""
    if s.pace != "learned":
        return FixedPacer(PACES[s.pace])
    return LearnedPacer(list(PACES.values()),
                        BanditConfig(match_spans=s.matched_spans, match_max_loss=s.match_max_loss,
                                     reward=s.pace_reward, lossy_rounds_steps=s.lossy_rounds_steps))


def scheduler_config(cfg: RunConfig) -> SchedulerConfig:
    """What the adaptive scheduler's parts are given, from the run's settings."""
    s = cfg.scheduler
    plan = PlanConfig(
        target_updates=cfg.clients_per_round, batch_size=cfg.training.batch_size, max_overselect=s.max_overselect,
        min_epochs=s.min_epochs, max_epochs=s.max_epochs, deadline_quantile=s.deadline_quantile,
        deadline_epochs=float(cfg.training.local_epochs), min_deadline_s=s.min_deadline,
        max_deadline_s=cfg.round_timeout, max_staleness=s.max_staleness, staleness_exponent=s.staleness_exponent,
        fairness_rounds=s.fairness_rounds,
        gateway_bytes_per_s=s.gateway_mbps * 1e6 / 8 if s.gateway_mbps > 0 else math.inf,
        absence_stretch=s.absence_stretch, loss_utility=s.loss_utility,
    )
    guard = GuardConfig(norm_limit=s.update_norm_limit, on_large_norm=s.large_update)
    return SchedulerConfig(plan=plan, server_lr=s.server_lr, thin_steps=s.thin_steps,
                           battery_reserve=s.battery_reserve, guard=guard, step_fill=s.step_fill,
                           robust=s.robust_aggregation, compression=s.compression, staleness_damping=s.paced_staleness,
                           max_transfer_share=s.max_transfer_share,
                           feedback=FeedbackConfig(min_server_lr=s.min_server_lr))
