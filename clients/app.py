"""The ClientApp: trains or evaluates the task a message names, on the board's own data or on
the partition of public data the message names, and reports how fast.

Replies carry, beside the weights, what the job did (samples, steps, seconds, samples/s,
loss): the scheduler's performance model learns each device's speed from them. The node's
`device-id` (node config) is echoed so the gateway can join Flower nodes to MQTT devices; a
`query` message asks only that and, for a board with its own data (node config `local-data`,
a folder laid out as edgesched.local_data reads), how many samples it holds. It is answered
without loading torch (a deployed SuperNode starts a fresh process for every message).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgesched import local_data, partition
from edgesched.clients import compressed
from edgesched.clients.job_report import mark_training, state_dir, write_job_report
from edgesched.files import atomic_write
from edgesched.flower.messages import ARRAYS, CONFIG, DEVICE, ENCODING, METRICS, job_seed

if TYPE_CHECKING:
    from torch import nn

    from edgesched.tasks import Task

app = ClientApp()
# Which partition: data set, data folder, partitioner, partitions, alpha, seed, partition id.
PartitionKey = tuple[str, str | None, str, int, float, int, int]


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Which device is this node, and how much data of its own does it hold? The gateway asks once,
    when the node appears: a board's own data size sizes its work and weights its updates."""
    answer: dict[str, str | int] = {"device-id": _device_id(context)}
    if (folder := _own_data(context)) is not None:
        answer["samples"] = local_data.count(folder)
    return Message(RecordDict({DEVICE: ConfigRecord(answer)}), reply_to=msg)


@app.train()
def train_job(msg: Message, context: Context) -> Message:
    board = "device-id" in context.node_config  # a real board, with an agent beside it
    if board:
        mark_training(_device_id(context))
    task, job, model, x, y, start = _prepare(msg, context)
    report = task.train(
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
    if board:  # hand the speed to its agent
        write_job_report(_device_id(context), report.samples_per_second, report.seconds)
    metrics = {"num-examples": len(y), "partition-id": int(job["partition-id"]), **report.as_metrics()}
    if start is None:
        return _reply(msg, context, ArrayRecord(model.state_dict()), metrics)
    trained = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    arrays, encoding = compressed.compress_update(start, trained, report.steps, job, _job_state(context))
    reply = _reply(msg, context, arrays, metrics)
    reply.content[ENCODING] = encoding
    return reply


@app.evaluate()
def evaluate_job(msg: Message, context: Context) -> Message:
    """Score the global model on the partition; with node config `evaluate-with=onnxruntime`, the
    way the board will run it once shipped (the ONNX export, in onnxruntime)."""
    task, job, model, x, y, _ = _prepare(msg, context)
    if context.node_config.get("evaluate-with", "torch") == "onnxruntime":
        from edgesched.export import evaluate_onnx, to_onnx

        onnx = to_onnx(str(job["dataset"]), {k: v.detach().numpy() for k, v in model.state_dict().items()},
                       raw_inputs=False)
        loss, accuracy = evaluate_onnx(onnx, x, y)
    else:
        loss, accuracy = task.evaluate(model, x, y)
    metrics = {"num-examples": len(y), "partition-id": int(job["partition-id"]), "loss": loss, "accuracy": accuracy}
    return _reply(msg, context, None, metrics)


def _prepare(msg: Message, context: Context) -> tuple[Task, ConfigRecord, nn.Module, np.ndarray, np.ndarray,
                                                      compressed.Weights | None]:
    """The job's task and config, the global model it carries, the data it trains on, and, for a
    compressed job, the model as rebuilt (what its update is the change from)."""
    import torch

    from edgesched.tasks import resolve

    job = msg.content[CONFIG]
    task = resolve(str(job["dataset"]))
    x, y = _local_data(task, job, context)
    model = task.build()
    if not compressed.is_compressed(job):
        model.load_state_dict(msg.content[ARRAYS].to_torch_state_dict())
        return task, job, model, x, y, None
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    start = compressed.rebuild(msg.content[ARRAYS], job, shapes, _job_state(context))
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in start.items()})
    return task, job, model, x, y, start


def _job_state(context: Context) -> Path:
    """Where this board keeps a run's compressed-job state (the rebuilt models, the residual)."""
    return state_dir() / _device_id(context) / f"run-{context.run_id}"


def _reply(msg: Message, context: Context, arrays: ArrayRecord | None, metrics: dict[str, float | int]) -> Message:
    content = RecordDict({METRICS: MetricRecord(metrics), DEVICE: ConfigRecord({"device-id": _device_id(context)})})
    if arrays is not None:
        content[ARRAYS] = arrays
    return Message(content, reply_to=msg)


def _device_id(context: Context) -> str:
    return str(context.node_config.get("device-id", f"node-{context.node_id}"))


def _local_data(task: Task, job: ConfigRecord, context: Context) -> tuple[np.ndarray, np.ndarray]:
    """A board's own data (node config `local-data`), read once per run; else the job's partition
    of the public data (a device's node config `data-dir` overrides the server's path)."""
    if (folder := _own_data(context)) is not None:
        return _on_disk(("local", task.name, str(folder.resolve()), context.run_id), lambda: _read_own(task, folder))
    data_dir = str(context.node_config.get("data-dir", job["data-dir"])) or None
    key: PartitionKey = (str(job["dataset"]), data_dir, str(job["partitioner"]), int(job["num-partitions"]),
           float(job["alpha"]), int(job["seed"]), int(job["partition-id"]))
    if "device-id" in context.node_config:  # a real board
        return _on_disk(key, lambda: _split(key))
    return _split(key)  # a simulation worker keeps the data set in memory across jobs


def _own_data(context: Context) -> Path | None:
    """The board's own data folder (node config `local-data`; empty: none)."""
    folder = str(context.node_config.get("local-data", ""))
    return Path(folder) if folder else None


def _read_own(task: Task, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = local_data.read(folder, task.classes, task.raw_shape)
    return (task.normalise(x) if task.normalise else x), y


def _split(key: PartitionKey) -> tuple[np.ndarray, np.ndarray]:
    from edgesched.tasks import load_data

    dataset, data_dir, scheme, num_partitions, alpha, seed, partition_id = key
    indices = _partition_indices(dataset, data_dir, scheme, num_partitions, alpha, seed)[partition_id]
    ds = load_data(dataset, data_dir)
    return ds.x_train[indices], ds.y_train[indices]


def _on_disk(key: tuple, make: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """A board trains the same data job after job, each in a new process: keep it decoded on disk,
    so a job reads its share instead of decoding (and splitting, or reading image by image) it all.
    A board's own data is keyed by the run: what it gathers during a run is trained from the next,
    so every reply of a run reports the size the board declared when it joined."""
    path = state_dir() / "partitions" / f"{key[0]}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.npz"
    try:
        with np.load(path) as saved:
            return saved["x"], saved["y"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):  # not there yet, or damaged
        pass
    x, y = make()
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
    from edgesched.tasks import load_data

    ds = load_data(dataset, data_dir)
    return partition.partition(ds.y_train, ds.groups, scheme, num_partitions, alpha, seed)
