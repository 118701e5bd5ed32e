"""Hostile replies through the engine's reply path: whatever one device reports and sends, the
global model stays finite and no server step moves it further than the plan allows."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.config import RunConfig
from edgesched.core import policies
from edgesched.core.predict import Predictor
from edgesched.core.transport import Reply

from .fakes import Fleet, ScriptedTransport, StepClock, run

HOSTILE = "d3"
numbers = st.one_of(st.integers(-(2**63), 2**63), st.sampled_from([0, 1, 2, 60, 64, 240, 10**9, 10**308]))
metrics = st.fixed_dictionaries({}, optional={"partition": numbers, "samples": numbers, "steps": numbers,
                                              "num_examples": numbers})
tensors = st.one_of(
    st.floats(-1e30, 1e30, allow_nan=False).map(lambda k: ("scale", k)),  # sign-flipped, scaled, zeroed
    st.sampled_from([("fill", np.nan), ("fill", np.inf), ("fill", -np.inf), ("fill", 3e38)]),
    st.sampled_from([("shape", 2), ("shape", 4), ("dtype", np.float64)]),
)


class HostileTransport(ScriptedTransport):
    """d3 sends `tensors` in place of its honest update and reports `metrics` of its own."""

    def __init__(self, clock: StepClock, lie: dict, how: tuple) -> None:
        super().__init__(clock, {f"d{i}": 1.0 + i for i in range(4)}, delta=0.01)
        self.lie, self.how = lie, how

    def _reply(self, s):
        reply = super()._reply(s)
        if s.device != HOSTILE or reply.trained is None:
            return reply
        kind, value = self.how
        base, trained = s.model[0], reply.trained[0]
        if kind == "scale":
            forged = (base + value * (trained - base)).astype(base.dtype)
        elif kind == "fill":
            forged = np.full_like(base, value)
        elif kind == "shape":
            forged = np.zeros(value, dtype=base.dtype)
        else:
            forged = trained.astype(value)
        return Reply(reply.job_id, reply.node, reply.device_claim, trained=[forged],
                     metrics=dataclasses.replace(reply.metrics, **self.lie))


def honest_step_norm() -> float:
    """The largest honest update per local step (d2's: 0.01 x 3 per coordinate, two steps)."""
    return float(np.linalg.norm(np.full(3, 0.03))) / 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lie=metrics, how=tensors)
def test_no_reply_makes_the_model_non_finite_or_moves_it_beyond_the_plan(lie, how):
    cfg = RunConfig.from_mapping({"clients": 4, "fraction-train": 1.0, "round-timeout": 600.0,
                                  "strategy": "edgesched", "min-round-share": 1.0})
    policy = policies.edgesched(cfg, Predictor(4 * 10_000))
    clock = StepClock()
    transport = HostileTransport(clock, lie, how)
    before = np.ones(3, dtype=np.float32)
    state, records = run(policy, transport, Fleet(4), steps=3, weights={"w": before.copy()})

    model = state.model[0]
    assert np.all(np.isfinite(model)) and model.dtype == np.float32 and model.shape == (3,)
    # An update may count no more steps than its order allowed, each no larger than the
    # norm limit times the median (honest) size per step: that is the most a step can move.
    most_steps = max(s.order.steps or 0 for s in transport.sent)
    limit = cfg.scheduler.update_norm_limit * honest_step_norm() * most_steps
    moves = np.diff(np.array([before, *transport_models(transport), model]), axis=0)
    assert all(np.linalg.norm(m) <= limit * 1.001 for m in moves)
    assert records, "the run took its steps"


def transport_models(transport: ScriptedTransport) -> list[np.ndarray]:
    """The global model each step started from, as the jobs carried it (one per step)."""
    first = {}
    for s in transport.sent:
        first.setdefault(s.step, s.model[0])
    return [first[step] for step in sorted(first)][1:]
