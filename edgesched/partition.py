"""Split a training set among federated clients: IID, Dirichlet label skew, natural groups, or
IID samples shared by a fleet larger than the data set.

All splits are functions of their inputs and a seeded `numpy.random.Generator`, so a seed
gives the same split in the server process and in every simulation worker.
"""

from __future__ import annotations

import numpy as np

from edgesched.config import PARTITIONERS
from edgesched.errors import ConfigError


def iid(num_samples: int, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and deal the samples into `num_partitions` near-equal shares."""
    _check_count(num_partitions, num_samples)
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_partitions)]


def dirichlet(
    labels: np.ndarray,
    num_partitions: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Label skew: each class is spread over clients in Dirichlet(alpha) proportions.

    Smaller `alpha` means more skew (alpha -> 0: one class per client; alpha -> inf: IID).
    Draws are repeated until every client holds at least `min_size` samples, as in
    Hsu et al. (2019), because an empty client cannot train.
    """
    if not alpha > 0:
        raise ConfigError(f"alpha must be > 0, got {alpha}")
    _check_count(num_partitions, len(labels) // max(min_size, 1))
    classes = np.unique(labels)
    for _ in range(max_tries):
        shares: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        for cls in classes:
            members = rng.permutation(np.flatnonzero(labels == cls))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_partitions, alpha)))[:-1] * len(members))
            for client, chunk in enumerate(np.split(members, cuts.astype(int))):
                shares[client].append(chunk)
        parts = [np.sort(np.concatenate(chunks)) for chunks in shares]
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise ConfigError(
        f"could not give each of {num_partitions} clients {min_size} samples with "
        f"alpha={alpha}; use fewer clients, a larger alpha, or the dirichlet-balanced partitioner"
    )


def dirichlet_balanced(labels: np.ndarray, num_partitions: int, alpha: float,
                       rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew with equal client sizes: each client draws its label mix from Dirichlet(alpha).

    The per-class split above cannot give a thousand clients of a 60,000-sample set a
    minimum share each (most draws leave some clients near empty); here every client gets
    N / num_partitions samples (+-1), drawn from the classes in its own proportions while
    they last, then from whatever classes remain.
    """
    if not alpha > 0:
        raise ConfigError(f"alpha must be > 0, got {alpha}")
    _check_count(num_partitions, len(labels))
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    remaining = np.array([len(p) for p in pools])
    used = np.zeros(len(classes), dtype=int)
    sizes = np.full(num_partitions, len(labels) // num_partitions)
    sizes[: len(labels) % num_partitions] += 1
    parts = []
    for size in sizes:
        mix = rng.dirichlet(np.full(len(classes), alpha))
        take = np.zeros(len(classes), dtype=int)
        need = int(size)
        while need > 0:
            p = mix * (remaining > 0)
            p = p / p.sum() if p.sum() > 0 else (remaining > 0) / np.count_nonzero(remaining)
            draw = np.minimum(rng.multinomial(need, p), remaining)
            take += draw
            remaining -= draw
            need -= int(draw.sum())
        parts.append(np.sort(np.concatenate([pools[c][used[c]:used[c] + take[c]] for c in range(len(classes))])))
        used += take
    return parts


SAMPLED_SHARE = 32  # the least a `sampled` client holds: one batch


def sampled(num_samples: int, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
    """IID shares of `num_samples // num_partitions` samples, at least `SAMPLED_SHARE`, dealt
    from successive shuffles of the whole set: a fleet larger than the data set (100,000
    virtual phones on 60,000 images) still trains, its devices sharing samples."""
    if num_partitions < 1:
        raise ConfigError(f"clients must be at least 1, got {num_partitions}")
    share = max(num_samples // num_partitions, min(SAMPLED_SHARE, num_samples))
    rounds = -(-num_partitions * share // num_samples)
    dealt = np.concatenate([rng.permutation(num_samples) for _ in range(rounds)])
    return [np.sort(part) for part in dealt[:num_partitions * share].reshape(num_partitions, share)]


def natural(groups: np.ndarray) -> list[np.ndarray]:
    """One partition per group (e.g. per user), in sorted group order."""
    return [np.flatnonzero(groups == g) for g in np.unique(groups)]


def partition(
    labels: np.ndarray,
    groups: np.ndarray | None,
    scheme: str,
    num_partitions: int,
    alpha: float,
    seed: int,
) -> list[np.ndarray]:
    """Dispatch to a partitioner by name; the one entry point the task code uses."""
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return iid(len(labels), num_partitions, rng)
    if scheme == "dirichlet":
        return dirichlet(labels, num_partitions, alpha, rng)
    if scheme == "dirichlet-balanced":
        return dirichlet_balanced(labels, num_partitions, alpha, rng)
    if scheme == "sampled":
        return sampled(len(labels), num_partitions, rng)
    if scheme == "natural":
        if groups is None:
            raise ConfigError("partitioner 'natural' needs a data set with groups (hapt)")
        parts = natural(groups)
        if len(parts) != num_partitions:
            raise ConfigError(
                f"the natural split has {len(parts)} groups; set clients to {len(parts)}"
            )
        return parts
    raise ConfigError(f"unknown partitioner {scheme!r}; choose one of {', '.join(PARTITIONERS)}")


def _check_count(num_partitions: int, capacity: int) -> None:
    if not 1 <= num_partitions <= capacity:
        raise ConfigError(f"clients must be between 1 and {capacity}, got {num_partitions}")
