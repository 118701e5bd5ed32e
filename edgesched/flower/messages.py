"""The wire contract between server and ClientApp: record names and per-job config keys.

Each job message names the partition to train, so any node can train any partition: in
simulation a few executor nodes can stand in for many virtual devices, and on a device the
node config can override the data folder with its own local data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from edgesched.config import RunConfig
from edgesched.core.compress import Malformed, Packed, decode
from edgesched.core.records import JobMetrics
from edgesched.core.transport import Reply

ARRAYS, CONFIG, METRICS, DEVICE = "arrays", "config", "metrics", "device"
ENCODING = "encoding"  # a compressed reply's record: {"bits": its width}
SCALES = "#scales"  # a compressed tensor `k` travels as `k` (its codes) and `k#scales`
# A compressed job's config: the update's width, and the model as a difference (edgesched.core.downlink).
UPLINK_BITS, DOWNLINK_BITS = "uplink-bits", "downlink-bits"
DOWNLINK_BASE, DOWNLINK_TAG = "downlink-base", "downlink-tag"
BASE_MISSING = "downlink base not held"  # a board's error when it lacks the copy a job's difference is from


def job_config(cfg: RunConfig, server_round: int, partition_id: int) -> dict[str, int | float | str]:
    """The ConfigRecord for one client's job in one round (each client gets its own)."""
    return {
        "server-round": server_round,
        "partition-id": partition_id,
        "num-partitions": cfg.data.clients,
        "dataset": cfg.data.dataset,
        "data-dir": cfg.data.data_dir or "",
        "partitioner": cfg.data.partitioner,
        "alpha": cfg.data.alpha,
        "seed": cfg.seed,
        "local-epochs": cfg.training.local_epochs,
        "batch-size": cfg.training.batch_size,
        "lr": cfg.training.lr,
    }


def job_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A distinct, reproducible seed per (run, round, partition) for local shuffling."""
    return (seed * 1_000_003 + server_round * 10_007 + partition_id) % (2**31)


def model_record(keys: Sequence[str], weights: Sequence[np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(w) for k, w in zip(keys, weights, strict=True)})


def packed_record(keys: Sequence[str], packed: Sequence[Packed]) -> ArrayRecord:
    """Compressed tensors as arrays: each key's codes, and its scales under `key#scales`."""
    record = ArrayRecord()
    for key, p in zip(keys, packed, strict=True):
        record[key], record[key + SCALES] = Array(p.codes), Array(p.scales)
    return record


def unpacked(record: ArrayRecord, keys: Sequence[str]) -> list[Packed]:
    """The compressed tensors of `keys` in `record`; Malformed unless it holds exactly those."""
    expected = {k for key in keys for k in (key, key + SCALES)}
    if set(record) != expected:
        raise Malformed("the compressed tensors do not name the model's")
    return [Packed(record[k].numpy(), record[k + SCALES].numpy()) for k in keys]


def train_message(arrays: ArrayRecord, config: dict[str, int | float | str], node: int, step: int) -> Message:
    """One training job for one node."""
    return Message(RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(config)}), dst_node_id=node,
                   message_type=MessageType.TRAIN, group_id=str(step))


@dataclass(frozen=True)
class Compressed:
    """What a compressed job's reply must be: its model's tensors in `bits` bits."""

    keys: Sequence[str]
    shapes: Sequence[tuple[int, ...]]
    bits: int


def decode_reply(reply: Message, job_id: str, max_bytes: float, compressed: Compressed | None = None,
                 sent_bytes: int = 0) -> Reply:
    """A ClientApp's reply as the engine takes it. One carrying more tensor bytes than `max_bytes`
    is refused before its tensors are decoded; figures that are missing or not finite numbers
    leave `metrics` None. The reply to a `compressed` job must be its update in exactly that
    form (a change, at that width), else it is refused as malformed; `sent_bytes`: the model
    bytes the job carried down (the reply's `moved`)."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        return Reply(job_id, node, None, error=reply.error.reason)
    claim = str(reply.content[DEVICE]["device-id"]) if DEVICE in reply.content else None
    if ARRAYS not in reply.content:
        return Reply(job_id, node, claim, error="no weights in the reply")
    if sum(len(a.data) for a in reply.content[ARRAYS].values()) > max_bytes:
        return Reply(job_id, node, claim, refusal="oversized")
    if (ENCODING in reply.content) != (compressed is not None):
        return Reply(job_id, node, claim, refusal="malformed: not in the form the job was sent in")
    if compressed is None:
        trained = reply.content[ARRAYS].to_numpy_ndarrays()
        return Reply(job_id, node, claim, trained=trained, metrics=job_metrics(reply),
                     moved=(sent_bytes, sum(t.nbytes for t in trained)))
    try:
        if reply.content[ENCODING].get("bits") != compressed.bits:
            raise Malformed(f"not {compressed.bits} bits wide, as the job was sent")
        packed = unpacked(reply.content[ARRAYS], compressed.keys)
        change = decode(packed, compressed.shapes, compressed.bits)
    except Malformed as exc:
        return Reply(job_id, node, claim, refusal=f"malformed: {exc}")
    return Reply(job_id, node, claim, trained=change, metrics=job_metrics(reply), delta=True,
                 moved=(sent_bytes, sum(p.nbytes for p in packed)))


def job_metrics(reply: Message) -> JobMetrics | None:
    """The job figures a reply reports; None if any is missing or not a finite number."""
    keys = ("partition-id", "samples", "steps", "num-examples", "seconds", "samples-per-second", "loss")
    try:
        m = [float(reply.content[METRICS][k]) for k in keys]
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in m):
        return None
    partition, samples, steps, examples, seconds, speed, loss = m
    return JobMetrics(int(partition), int(samples), int(steps), int(examples), seconds, speed, loss)
