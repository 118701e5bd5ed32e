"""The global model as ONNX, and its evaluation with onnxruntime.

ONNX is how a trained model leaves the federation: onnxruntime runs it on boards and phones
that have no torch, and it is what a device's inference service loads. A model of each data
set is exported with a dynamic batch dimension (opset 17) by torch's TorchScript exporter:
it needs only the `onnx` package and takes 0.2 s for the Fashion-MNIST CNN, where the dynamo
exporter needs onnxscript and took 3.6 s for the same file (torch 2.13); torch marks the
TorchScript path deprecated, so its warning is silenced here and the choice is one line.
An export for boards (`edgesched export --onnx`, `onnx-every-round`) starts with the data set's
input normalisation, so a board feeds it raw readings. `evaluate_onnx` scores an export exactly
as `edgesched.training.evaluate` scores the torch model (same loss, same accuracy, to float
rounding) so that it can be checked before it ships.
"""

from __future__ import annotations

import io
import time
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesched.data import Normalise
from edgesched.errors import EdgeschedError
from edgesched.tasks import resolve

OPSET = 17
INSTALL_HINT = "pip install 'edgesched[onnx]' (onnx and onnxruntime)"


def to_onnx(dataset: str, weights: Mapping[str, np.ndarray], raw_inputs: bool = True) -> bytes:
    """The task's model carrying `weights` (a state dict of arrays), as ONNX bytes. With
    `raw_inputs`, the graph starts with the task's `normalise` and takes raw readings, so a board
    that runs it needs nothing but onnxruntime and its own data."""
    import torch

    require("onnx")
    task = resolve(dataset)
    model = task.build()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
    shape = task.input_shape
    normalise = task.normalise if raw_inputs else None
    if normalise is not None:
        model = _normalising(model, normalise)
        shape = shape[1:] if normalise.channel_axis else shape
    model.eval()
    buffer = io.BytesIO()
    example = torch.zeros((1, *shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (example,), buffer, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=OPSET, dynamo=False)
    return buffer.getvalue()


def _normalising(model: Any, normalise: Normalise) -> Any:
    """`model` behind `normalise`, as one torch module to export."""
    import torch

    class Normalising(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            for name in ("mean", "std"):
                self.register_buffer(name, torch.tensor(np.asarray(getattr(normalise, name), dtype=np.float32)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = (x / normalise.divisor - self.mean) / self.std
            return self.model(x.unsqueeze(1) if normalise.channel_axis else x)

    return Normalising()


def load_weights(path: Path, dataset: str) -> dict[str, np.ndarray]:
    """The state dict saved in `path` (a run's model.npz), checked against the data set's model:
    one line naming the file and what is wrong if it is truncated, not an npz, or another model's."""
    if not zipfile.is_zipfile(path):  # empty, cut short, overwritten: np.load's own errors mislead
        raise EdgeschedError(f"{path}: not an .npz archive (truncated or overwritten?)")
    try:
        with np.load(path) as saved:  # allow_pickle=False: an npz holding objects is refused, not run
            weights = {k: saved[k] for k in saved.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise EdgeschedError(f"{path}: unreadable .npz archive ({exc})") from None
    expected = {k: tuple(v.shape) for k, v in resolve(dataset).build().state_dict().items()}
    wrong = sorted(k for k in expected.keys() | weights.keys()
                   if k not in weights or expected.get(k) != weights[k].shape)
    if wrong:
        raise EdgeschedError(f"{path}: not the {dataset} model's weights (missing, extra or misshapen: "
                             f"{', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''})")
    return weights


def evaluate_onnx(model: bytes | Path, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of an ONNX model on (x, y), with onnxruntime on the CPU."""
    require("onnxruntime")
    import onnxruntime

    source = str(model) if isinstance(model, Path) else model
    session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    loss = correct = 0.0
    for start in range(0, len(y), batch_size):
        batch = x[start:start + batch_size].astype(np.float32, copy=False)  # raw pixels may come as uint8
        logits = session.run(None, {"x": batch})[0].astype(np.float64)
        yb = y[start:start + batch_size]
        top = logits.max(axis=1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        loss += float(np.sum(log_norm - logits[np.arange(len(yb)), yb]))
        correct += int(np.sum(logits.argmax(axis=1) == yb))
    return loss / len(y), correct / len(y)


def infer_samples_per_s(dataset: str, seconds: float = 1.0, batch_size: int = 32) -> float:
    """How many samples a second this machine's onnxruntime infers with the data set's model
    (random weights and inputs: speed does not depend on them), timed for about `seconds`."""
    require("onnxruntime")
    import onnxruntime

    task = resolve(dataset)
    weights = {k: v.detach().numpy() for k, v in task.build().state_dict().items()}
    session = onnxruntime.InferenceSession(to_onnx(dataset, weights, raw_inputs=False),
                                           providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch_size, *task.input_shape)).astype(np.float32)
    session.run(None, {"x": x})  # warm-up: the first run allocates
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        session.run(None, {"x": x})
        done += batch_size
    return done / elapsed


def require(module: str) -> None:
    """Fail with the install hint if `module` (onnx, onnxruntime) is missing."""
    try:
        __import__(module)
    except ImportError:
        raise EdgeschedError(f"ONNX needs the {module} package: {INSTALL_HINT}") from None
