"""Aggregation of model updates as plain numpy arrays (no Flower, no torch)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weighted_average(updates: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """FedAvg: the per-tensor average of `updates`, weighted (e.g. by sample count).

    Sums in float64 and in the order given, so the same updates in the same order give
    bit-identical results; callers sort updates by a stable key first.
    """
    if not updates or len(updates) != len(weights):
        raise ValueError("need one weight per update and at least one update")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative and not all zero")
    w = w / w.sum()
    averaged = []
    for tensors in zip(*updates, strict=True):
        acc = np.zeros(tensors[0].shape, dtype=np.float64)
        for share, tensor in zip(w, tensors, strict=True):
            acc += share * tensor
        averaged.append(acc.astype(tensors[0].dtype))
    return averaged
