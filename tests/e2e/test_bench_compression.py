"""The compression benchmark's accuracy held over the end of the budget (benchmarks/compression.py)."""

from __future__ import annotations

import math

import pytest

from benchmarks.compression import held_accuracy, sustained_from


def test_each_model_counts_for_as_long_as_it_was_the_global_one() -> None:
    curve = [(0.0, 0.5), (10.0, 0.9), (25.0, 0.1)]  # the last step comes after the budget
    assert held_accuracy(curve, 5.0, 20.0) == pytest.approx((5 * 0.5 + 10 * 0.9) / 15)


def test_one_late_dip_moves_the_held_accuracy_by_its_share_of_the_time() -> None:
    steady = [(float(t), 0.86) for t in range(0, 240, 4)]
    dipped = [*steady[:-1], (236.0, 0.60)]
    assert held_accuracy(steady, 180.0, 240.0) == pytest.approx(0.86)
    assert held_accuracy(dipped, 180.0, 240.0) == pytest.approx(0.86 - 0.26 * 4 / 60)


def test_no_step_in_the_window_gives_no_figure() -> None:
    assert math.isnan(held_accuracy([], 0.0, 10.0))
    assert math.isnan(held_accuracy([(12.0, 0.9)], 0.0, 10.0))


def test_a_spike_past_the_target_is_not_the_model_staying_there() -> None:
    curve = [(10.0, 0.86), (20.0, 0.80), (30.0, 0.85), (40.0, 0.87), (50.0, 0.84), (60.0, 0.85),
             (70.0, 0.86), (80.0, 0.88)]
    assert sustained_from(curve, 0.85) == 60.0  # 10 s and 30 s were crossings that fell back
    assert sustained_from(curve, 0.85, steps=1) == 10.0
    assert sustained_from(curve, 0.9) is None
