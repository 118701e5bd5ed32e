"""The ClientApp: trains or evaluates the partition a message names and reports how fast.

Replies carry, beside the weights, what the job did (samples, steps, seconds, samples/s,
loss): the scheduler's performance model learns each device's speed from them. The node's
`device-id` (node config) is echoed so the gateway can join Flower nodes to MQTT devices; a
`query` message asks only that, so it is answered without loading torch (a deployed SuperNode
starts a fresh process for every message).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgesched import data, partition
from edgesched.clients.job_report import state_dir, write_job_report
from edgesched.files import atomic_write
from edgesched.flower.messages import ARRAYS, CONFIG, DEVICE, METRICS, job_seed

if TYPE_CHECKING:
    from torch import nn

app = ClientApp()
# Which partition: data set, data folder, partitioner, partitions, alpha, seed, partition id.
PartitionKey = tuple[str, str | None, str, int, float, int, int]


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Which device is this node? The gateway asks once, when the node appears."""
    return Message(RecordDict({DEVICE: ConfigRecord({"device-id": _device_id(context)})}), reply_to=msg)


@app.train()
def train_job(msg: Message, context: Context) -> Message:
    from edgesched.training import train

    job, model, x, y = _prepare(msg, context)
    report = train(
        model,
        x,
        y,
        epochs=int(job["local-epochs"]),
        batch_size=int(job["batch-size"]),
        lr=float(job["lr"]),
        seed=job_seed(int(job["seed"]), int(job["server-round"]), int(job["partition-id"])),
        max_steps=int(job["max-steps"]) if "max-steps" in job else None,
        proximal_mu=float(job.get("proximal-mu", 0.0)),
    )
    metrics = {"num-examples": len(y), "partition-id": int(job["partition-id"]), **report.as_metrics()}
    if "device-id" in context.node_config:  # a real board: hand the speed to its agent
        write_job_report(_device_id(context), report.samples_per_second, report.seconds)
    return _reply(msg, context, ArrayRecord(model.state_dict()), metrics)


@app.evaluate()
def evaluate_job(msg: Message, context: Context) -> Message:
    """Score the global model on the partition; with node config `evaluate-with=onnxruntime`, the
    way the board will run it once shipped (the ONNX export, in onnxruntime)."""
    from edgesched.training import evaluate

    job, model, x, y = _prepare(msg, context)
    if context.node_config.get("evaluate-with", "torch") == "onnxruntime":
        from edgesched.export import evaluate_onnx, to_onnx

        onnx = to_onnx(str(job["dataset"]), {k: v.detach().numpy() for k, v in model.state_dict().items()})
        loss, accuracy = evaluate_onnx(onnx, x, y)
    else:
        loss, accuracy = evaluate(model, x, y)
    metrics = {"num-examples": len(y), "partition-id": int(job["partition-id"]), "loss": loss, "accuracy": accuracy}
    return _reply(msg, context, None, metrics)


def _prepare(msg: Message, context: Context) -> tuple[ConfigRecord, nn.Module, np.ndarray, np.ndarray]:
    """The job's config, the global model it carries, and the partition it names."""
    from edgesched.models import build_model

    job = msg.content[CONFIG]
    x, y = _local_data(job, context)
    model = build_model(str(job["dataset"]))
    model.load_state_dict(msg.content[ARRAYS].to_torch_state_dict())
    return job, model, x, y


def _reply(msg: Message, context: Context, arrays: ArrayRecord | None, metrics: dict[str, float | int]) -> Message:
    content = RecordDict({METRICS: MetricRecord(metrics), DEVICE: ConfigRecord({"device-id": _device_id(context)})})
    if arrays is not None:
        content[ARRAYS] = arrays
    return Message(content, reply_to=msg)


def _device_id(context: Context) -> str:
    return str(context.node_config.get("device-id", f"node-{context.node_id}"))


def _local_data(job: ConfigRecord, context: Context) -> tuple[np.ndarray, np.ndarray]:
    """The job's partition; a device's node config `data-dir` overrides the server's path."""
    data_dir = str(context.node_config.get("data-dir", job["data-dir"])) or None
    key: PartitionKey = (str(job["dataset"]), data_dir, str(job["partitioner"]), int(job["num-partitions"]),
           float(job["alpha"]), int(job["seed"]), int(job["partition-id"]))
    if "device-id" in context.node_config:  # a real board
        return _cached_split(key)
    return _split(key)  # a simulation worker keeps the data set in memory across jobs


def _split(key: PartitionKey) -> tuple[np.ndarray, np.ndarray]:
    dataset, data_dir, scheme, num_partitions, alpha, seed, partition_id = key
    indices = _partition_indices(dataset, data_dir, scheme, num_partitions, alpha, seed)[partition_id]
    ds = data.load(dataset, data_dir)
    return ds.x_train[indices], ds.y_train[indices]


def _cached_split(key: PartitionKey) -> tuple[np.ndarray, np.ndarray]:
    """A board trains the same partition job after job, each in a new process: keep it decoded
    on disk, so a job reads its share instead of decoding and splitting the whole data set."""
    path = state_dir() / "partitions" / f"{key[0]}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.npz"
    try:
        with np.load(path) as saved:
            return saved["x"], saved["y"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):  # not there yet, or damaged
        pass
    x, y = _split(key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    atomic_write(path, buffer.getvalue())
    return x, y


@lru_cache(maxsize=4)
def _partition_indices(
    dataset: str, data_dir: str | None, scheme: str, num_partitions: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Split once per process: every job in a worker reuses the same seeded split."""
    ds = data.load(dataset, data_dir)
    return partition.partition(ds.y_train, ds.groups, scheme, num_partitions, alpha, seed)
