"""The ONNX export scores like the torch model, in onnxruntime, in the ClientApp and from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MessageType, Metadata, RecordDict
from flwr.app.message.message import make_message

from edgesched import data
from edgesched.clients.app import app
from edgesched.config import RunConfig
from edgesched.export import evaluate_onnx, to_onnx
from edgesched.flower.messages import job_config
from edgesched.tasks import build_model
from edgesched.training import evaluate, train


def _trained(dataset: str, x: np.ndarray, y: np.ndarray) -> torch.nn.Module:
    model = build_model(dataset, seed=1)
    train(model, x[:512], y[:512], epochs=1, batch_size=32, lr=0.05, seed=0)
    return model


@pytest.mark.parametrize("dataset", ["digits", "fmnist"])
def test_onnxruntime_scores_the_export_as_torch_scores_the_model(dataset):
    ds = data.load(dataset)
    model = _trained(dataset, ds.x_train, ds.y_train)
    onnx = to_onnx(dataset, {k: v.numpy() for k, v in model.state_dict().items()}, raw_inputs=False)
    x, y = ds.x_test[:2000], ds.y_test[:2000]
    torch_loss, torch_acc = evaluate(model, x, y)
    onnx_loss, onnx_acc = evaluate_onnx(onnx, x, y)
    assert onnx_acc == pytest.approx(torch_acc, abs=1e-4) and torch_acc > 0.3  # trained, not chance
    assert onnx_loss == pytest.approx(torch_loss, abs=1e-4)


def test_the_client_app_can_evaluate_with_onnxruntime():
    cfg = RunConfig.from_mapping({"dataset": "digits", "clients": 5})
    model = _trained("digits", *(lambda d: (d.x_train, d.y_train))(data.load("digits")))
    results = {}
    for runtime in ("torch", "onnxruntime"):
        metadata = Metadata(run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="",
                            group_id="1", created_at=time.time(), ttl=60, message_type=MessageType.EVALUATE)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(job_config(cfg, 1, 0))})
        context = Context(run_id=1, node_id=7, node_config={"evaluate-with": runtime}, state=RecordDict(),
                          run_config={})
        reply = app(make_message(metadata, content), context)
        assert not reply.has_error(), reply.error
        results[runtime] = reply.content["metrics"]
    assert results["onnxruntime"]["accuracy"] == pytest.approx(results["torch"]["accuracy"], abs=1e-4)
    assert results["onnxruntime"]["loss"] == pytest.approx(results["torch"]["loss"], abs=1e-4)


def test_export_writes_a_checked_onnx_file_of_a_run(tmp_path):
    model = build_model("digits", seed=3)
    np.savez(tmp_path / "model.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
    (tmp_path / "config.json").write_text(json.dumps({"dataset": "digits"}))
    done = subprocess.run([sys.executable, "-m", "edgesched", "export", "--onnx", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ds = data.load("digits")
    assert evaluate_onnx(tmp_path / "model.onnx", ds.x_test_raw, ds.y_test)[1] == pytest.approx(
        evaluate(model, ds.x_test, ds.y_test)[1], abs=1e-4)
    assert "same as torch" in done.stdout


# What a board runs: onnxruntime and numpy, its own raw readings, nothing of edgesched.
BOARD = """
import gzip, json, sys
import numpy as np, onnxruntime
def read(path):
    return (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
images = np.frombuffer(read(sys.argv[2]), np.uint8, offset=16).reshape(-1, 28, 28).astype(np.float32)  # 0-255
labels = np.frombuffer(read(sys.argv[3]), np.uint8, offset=8)
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
predicted = np.concatenate([session.run(None, {"x": images[i:i + 1000]})[0].argmax(1) for i in range(0, 10000, 1000)])
print(json.dumps({"accuracy": float((predicted == labels).mean()),
                  "edgesched": sorted(m for m in sys.modules if m.startswith(("edgesched", "torch")))}))
"""


def test_an_exported_model_scores_on_raw_pixels_on_a_board_with_only_onnxruntime(tmp_path, fmnist_dir):
    ds = data.load("fmnist")
    model = _trained("fmnist", ds.x_train, ds.y_train)
    np.savez(tmp_path / "model.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
    (tmp_path / "config.json").write_text(json.dumps({"dataset": "fmnist"}))
    done = subprocess.run([sys.executable, "-m", "edgesched", "export", "--onnx", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (tmp_path / "board.py").write_text(BOARD)
    images, labels = (next(p for p in sorted(fmnist_dir.glob(f"t10k-{kind}-idx*"))) for kind in ("images", "labels"))
    board = subprocess.run([sys.executable, "-I", str(tmp_path / "board.py"), str(tmp_path / "model.onnx"),
                            str(images), str(labels)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert board.returncode == 0, board.stderr
    scored = json.loads(board.stdout)
    assert scored["edgesched"] == []  # neither edgesched nor torch was loaded
    torch_accuracy = evaluate(model, ds.x_test, ds.y_test)[1]
    assert torch_accuracy > 0.5 and scored["accuracy"] == pytest.approx(torch_accuracy, abs=1e-4)
