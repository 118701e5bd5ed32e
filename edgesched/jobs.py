"""The wire contract between server and ClientApp: record names and per-job config keys.

Each job message names the partition to train, so any node can train any partition: in
simulation a few executor nodes can stand in for many virtual devices, and on a device the
node config can override the data folder with its own local data.
"""

from __future__ import annotations

from edgesched.config import RunConfig

ARRAYS, CONFIG, METRICS, DEVICE = "arrays", "config", "metrics", "device"


def job_config(cfg: RunConfig, server_round: int, partition_id: int) -> dict[str, int | float | str]:
    """The ConfigRecord for one client's job in one round (each client gets its own)."""
    return {
        "server-round": server_round,
        "partition-id": partition_id,
        "num-partitions": cfg.clients or 1,
        "dataset": cfg.dataset,
        "data-dir": cfg.data_dir or "",
        "partitioner": cfg.partitioner or "",
        "alpha": cfg.alpha,
        "seed": cfg.seed,
        "local-epochs": cfg.local_epochs,
        "batch-size": cfg.batch_size,
        "lr": cfg.lr,
    }


def job_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A distinct, reproducible seed per (run, round, partition) for local shuffling."""
    return (seed * 1_000_003 + server_round * 10_007 + partition_id) % (2**31)
