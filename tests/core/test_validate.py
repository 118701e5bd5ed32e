"""Update validation: malformed and absurd updates never reach the model; repeat offenders rest."""

from __future__ import annotations

import numpy as np
import pytest

from edgesched.core.aggregate import Update, fednova, momentum_steps
from edgesched.core.decisions import Quarantined, Skipped
from edgesched.core.engine import Job
from edgesched.core.fleet import DeviceView
from edgesched.core.plan import PlanConfig
from edgesched.core.predict import Predictor
from edgesched.core.scheduler import Scheduler, SchedulerConfig
from edgesched.core.validate import GuardConfig, UpdateGuard

BASE = [np.zeros((4, 3), dtype=np.float32), np.zeros(3, dtype=np.float32)]


def trained(scale: float = 0.01, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(b - scale * rng.standard_normal(b.shape)).astype(b.dtype) for b in BASE]


def delta(weights: list[np.ndarray], base: list[np.ndarray] = BASE) -> list[np.ndarray]:
    return [b - w for b, w in zip(base, weights, strict=True)]


def size(tensors: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(t.astype(np.float64))) for t in tensors)))


def warmed(config: GuardConfig | None = None) -> UpdateGuard:
    guard = UpdateGuard(config)
    verdicts = guard.screen([("ok", delta(trained(seed=i)), 1) for i in range(10)], BASE, now=0.0)
    assert all(v.reason is None for v in verdicts)
    return guard


@pytest.mark.parametrize(("weights", "steps", "reason"), [
    ([np.full((4, 3), np.nan, np.float32), np.zeros(3, np.float32)], 1, "not_finite"),
    ([np.zeros((3, 4), np.float32), np.zeros(3, np.float32)], 1, "shape"),
    ([np.zeros((4, 3), np.float32)], 1, "shape"),
    ([np.zeros((4, 3), np.float64), np.zeros(3, np.float32)], 1, "dtype"),
    ([np.zeros((4, 3), np.float32), np.zeros(3, np.float32)], 0, "bad_metrics"),
])
def test_malformed_updates_are_refused_by_reason(weights, steps, reason):
    guard = UpdateGuard()
    verdict = guard.check("d", weights, BASE, steps=steps, data_size=600, now=0.0)
    assert verdict.delta is None and verdict.reason == reason
    assert guard.refused == {reason: 1}


def test_an_absurdly_large_update_is_clipped_to_the_limit_or_refused():
    guard = warmed()
    (verdict,) = guard.screen([("d", delta(trained(scale=1000.0)), 1)], BASE, now=0.0)
    assert verdict.reason == "clipped" and guard.clipped == 1
    normal = np.median([size(delta(trained(seed=i))) for i in range(10)])
    assert size(verdict.delta) == pytest.approx(normal, rel=1e-3)  # as large as a typical update, not 1000x
    refusing = warmed(GuardConfig(on_large_norm="refuse"))
    (verdict,) = refusing.screen([("d", delta(trained(scale=1000.0)), 1)], BASE, now=0.0)
    assert verdict.delta is None and verdict.reason == "norm" and refusing.refused == {"norm": 1}


def test_at_the_start_the_rounds_own_updates_are_the_yardstick():
    guard = UpdateGuard()
    batch = [("a", delta(trained(seed=1)), 1), ("b", delta(trained(seed=2)), 1), ("c", delta(trained(scale=50.0)), 1)]
    verdicts = guard.screen(batch, BASE, now=0.0)
    assert [v.reason for v in verdicts] == [None, None, "clipped"]


def test_a_long_jobs_momentum_built_size_is_not_mistaken_for_an_attack():
    guard = warmed()
    steps = 40  # momentum 0.9: each gradient moves the weights up to 10x over the job
    big = delta(trained(scale=0.01 * momentum_steps(steps, 0.9)))
    assert guard.screen([("d", big, steps)], BASE, now=0.0)[0].reason is None


def test_three_refusals_within_the_window_quarantine_a_device_for_a_while():
    guard = UpdateGuard(GuardConfig(strikes=3, strike_window_s=100.0, quarantine_s=50.0))
    nan = [np.full_like(b, np.nan) for b in BASE]
    guard.check("d", nan, BASE, 1, 600, now=0.0)
    guard.check("d", nan, BASE, 1, 600, now=150.0)  # the first strike has aged out of the window
    assert "d" not in guard.held(150.0)
    guard.check("d", nan, BASE, 1, 600, now=160.0)
    assert guard.check("d", nan, BASE, 1, 600, now=170.0).quarantined
    assert "d" in guard.held(219.0) and "d" not in guard.held(221.0)
    assert "other" not in guard.held(200.0)


def test_the_scheduler_gives_no_work_to_a_quarantined_device_and_never_aggregates_its_updates():
    s = Scheduler(SchedulerConfig(PlanConfig(target_updates=2, min_deadline_s=0.01)), Predictor(4 * 15))
    views = [DeviceView("good", 600, None, "pi"), DeviceView("bad", 600, None, "pi")]
    now = 0.0
    for rnd in range(1, 4):
        s.start_round(rnd)
        for a in s.plan(rnd, now, views):
            job = Job(f"{rnd}-{a.device}", a.device, rnd, None, now, s.dispatched(a, None))
            weights = trained(seed=rnd) if a.device == "good" else [np.full_like(b, np.inf) for b in BASE]
            s.arrived(job, now + 1, weights, BASE, steps=a.steps, samples=a.samples, data_size=600,
                      compute_s=0.5, loss=1.0)
        new, used = s.close_round(BASE, now + 1)
        assert used == 1 and all(np.all(np.isfinite(w)) for w in new)
        now += 10
    assert [e.device for e in s.log if isinstance(e, Quarantined)] == ["bad"]
    s.start_round(4)
    assert [a.device for a in s.plan(4, now, views)] == ["good"]
    assert Skipped(now, 4, "bad", "quarantined") in s.log
    assert s.guard.refused == {"not_finite": 3}


def test_robust_aggregation_ignores_one_wild_update_that_fednova_follows():
    good = [Update([np.array([1.0, 1.0])], samples=100, steps=1, staleness=0) for _ in range(4)]
    wild = Update([np.array([1000.0, -1000.0])], samples=100, steps=1, staleness=0)
    mean_step, _ = fednova([*good, wild], momentum=0.0, exponent=0.5)
    assert abs(mean_step[0][0]) > 100
    for method in ("median", "trimmed-mean"):
        (step,), _ = fednova([*good, wild], momentum=0.0, exponent=0.5, robust=method)
        np.testing.assert_allclose(step, [1.0, 1.0])


def test_with_no_yardstick_no_update_may_move_the_model_further_than_its_own_size():
    base = [np.ones((4, 3), dtype=np.float32), np.ones(3, dtype=np.float32)]
    guard = UpdateGuard()
    (verdict,) = guard.screen([("d", [np.full_like(b, 1000.0) for b in base], 1)], base, now=0.0)
    assert verdict.reason == "clipped"
    assert size(verdict.delta) == pytest.approx(np.sqrt(15.0), rel=1e-4)  # the norm of the model itself
    assert guard.screen([("d", [np.full_like(b, 0.01) for b in base], 1)], base, now=0.0)[0].reason is None
