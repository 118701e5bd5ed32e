"""Aggregation of model updates as plain numpy arrays (no Flower, no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def weighted_average(updates: Sequence[Sequence[np.ndarray]], weights: Sequence[float],
                     in_model_dtype: bool = False) -> list[np.ndarray]:
    """FedAvg: the per-tensor average of `updates`, weighted (e.g. by sample count).

    Sums in float64 and in the order given, so the same updates in the same order give
    bit-identical results; callers sort updates by a stable key first. `in_model_dtype` sums
    as Flower's `aggregate_arrayrecords` does instead: each tensor times its share, in the
    tensor's own precision (the `deadline` baseline is Flower's FedAvg and keeps its sums).
    """
    if not updates or len(updates) != len(weights):
        raise ValueError("need one weight per update and at least one update")
    if in_model_dtype:
        total = sum(weights)
        shares = [w / total for w in weights]
        summed = [t * shares[0] for t in updates[0]]
        for update, share in zip(updates[1:], shares[1:], strict=True):
            for acc, tensor in zip(summed, update, strict=True):
                acc += tensor * share
        return [np.asarray(t) for t in summed]
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


def apply_step(weights: Sequence[np.ndarray], step: Sequence[np.ndarray], lr: float) -> list[np.ndarray]:
    """The server step: `weights - lr * step`, computed in float64, kept in each tensor's dtype
    (and an array: numpy makes a 0-d result, such as BatchNorm's batch count, a bare scalar)."""
    return [np.asarray(w.astype(np.float64) - lr * s).astype(w.dtype) for w, s in zip(weights, step, strict=True)]


@dataclass(frozen=True)
class Update:
    """A client's model delta against the global model it started from, and what it cost.

    `delta` = start weights - trained weights; `steps` local SGD steps; `staleness` rounds the
    global model moved on while it trained; `bits` the width it was sent in (0: float32).
    """

    delta: Sequence[np.ndarray]
    samples: int  # the client's data size: its share of the objective
    steps: int
    staleness: int
    bits: int = 0


def momentum_steps(steps: int, momentum: float) -> float:
    """FedNova's a_i: how far `steps` of SGD with heavy-ball `momentum` move, in plain steps.

    Each gradient keeps acting through the momentum buffer, so it counts
    (1 - momentum ** remaining) / (1 - momentum) times (Wang et al., 2020, eq. 7 summed).
    """
    if momentum == 0:
        return float(steps)
    return (steps - momentum * (1 - momentum**steps) / (1 - momentum)) / (1 - momentum)


def staleness_weight(staleness: int, exponent: float) -> float:
    """FedAsync's polynomial discount: an update s rounds late counts (1 + s) ** -exponent."""
    return float((1 + staleness) ** -exponent)


def _discounted_sizes(updates: Sequence[Update], exponent: float) -> np.ndarray:
    """Each update's data size x its staleness discount."""
    return np.array([u.samples * staleness_weight(u.staleness, exponent) for u in updates], dtype=np.float64)


def fednova_shares(updates: Sequence[Update], exponent: float) -> np.ndarray | None:
    """Each update's share of a step: data size x staleness discount, summing to 1 (None: no weight)."""
    shares = _discounted_sizes(updates, exponent)
    if shares.sum() <= 0:
        return None
    shares /= shares.sum()
    return shares


def staleness_damping(updates: Sequence[Update], exponent: float) -> float:
    """How far a step on `updates` is taken: their staleness discounts' mean, weighted by data size.

    fednova's shares weigh a late update against the others only, so a step made of late updates
    alone moved the model as far as one of fresh ones. Streamed, nearly every update is a few
    steps late, and full steps from the models of a few steps back made the model swing by points
    from one step to the next. Scaled by this, a step of late updates moves the model less, as
    FedBuff's does (its deltas' discounts sum to less than one); a step of fresh ones is 1 exactly.
    """
    samples = float(np.sum([u.samples for u in updates], dtype=np.float64))
    if samples <= 0:
        return 1.0
    return float(_discounted_sizes(updates, exponent).sum()) / samples


def fednova(updates: Sequence[Update], momentum: float, exponent: float,
            robust: str = "none", trim: float = 0.2) -> tuple[list[np.ndarray], float]:
    """The server's step from buffered updates, normalised for unequal local work (FedNova).

    Each delta is divided by its local work a_i, so a device that ran three epochs does not
    pull the model three times as hard toward its own data; the average direction, weighted
    by data size and staleness, is then scaled back by the weighted mean work tau_eff.
    `robust` replaces the weighted average of directions by a coordinate-wise "median" or
    "trimmed-mean" (dropping the `trim` share at each end), so a few wrong updates that pass
    validation cannot drag the model (Yin et al., 2018); it ignores the data-size weights.
    Returns (step, tau_eff); the new global model is `weights - server_lr * step`.
    """
    if not updates:
        raise ValueError("need at least one update")
    shares = fednova_shares(updates, exponent)
    if shares is None:
        raise ValueError("updates carry no weight")
    work = np.array([momentum_steps(u.steps, momentum) for u in updates], dtype=np.float64)
    tau_eff = float(shares @ work)
    step = []
    for tensors in zip(*(u.delta for u in updates), strict=True):
        if robust == "none":
            acc = np.zeros(tensors[0].shape, dtype=np.float64)
            for share, a, tensor in zip(shares, work, tensors, strict=True):
                acc += (share / a) * tensor
        else:
            acc = _robust_mean(np.stack([t.astype(np.float64) / a for a, t in zip(work, tensors, strict=True)]),
                               robust, trim)
        step.append(tau_eff * acc)
    return step, tau_eff


def _robust_mean(stacked: np.ndarray, method: str, trim: float) -> np.ndarray:
    """Coordinate-wise median, or mean after dropping the `trim` share of values at each end."""
    if method == "median":
        median: np.ndarray = np.median(stacked, axis=0)
        return median
    if method != "trimmed-mean":
        raise ValueError(f"unknown robust aggregation {method!r}")
    cut = int(trim * len(stacked))
    ordered = np.sort(stacked, axis=0)
    trimmed: np.ndarray = ordered[cut:len(stacked) - cut].mean(axis=0)
    return trimmed
