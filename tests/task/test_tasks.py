"""A user's own task, named in the run config, and boards that train on their own data.

The task under test is examples/wine (its own model, data file and loader), never imported by
edgesched itself: what works for it works for a task edgesched has never seen."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, MessageType, Metadata, RecordDict
from flwr.app.message.message import make_message
from flwr.supercore.task_identity import TaskIdentity
from PIL import Image

from edgesched import local_data
from edgesched.clients.app import app
from edgesched.config import RunConfig
from edgesched.core.decisions import Arrived, Lost
from edgesched.errors import ConfigError, DataError
from edgesched.flower.messages import job_config
from edgesched.flower.run import run_on_grid
from edgesched.tasks import SHIPPED, resolve

from ..grids import LocalGrid

WINE = Path(__file__).resolve().parents[2] / "examples" / "wine"
WINE_TASK = f"{WINE / 'wine_task.py'}:task"


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESCHED_STATE_DIR", str(tmp_path / "state"))
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def _wine_rows() -> list[str]:
    return (WINE / "wine.csv").read_text().splitlines()[1:]


def board_folders(root: Path, boards: int) -> list[Path]:
    """Each board's own data.csv (the documented layout: label, then readings), wine by wine."""
    rows = _wine_rows()
    folders = []
    for b in range(boards):
        folder = root / f"board-{b}"
        folder.mkdir(parents=True)
        (folder / "data.csv").write_text("\n".join(rows[b::boards]) + "\n")
        folders.append(folder)
    return folders


def test_a_task_is_named_by_file_or_by_module(monkeypatch):
    by_file = resolve(WINE_TASK)
    monkeypatch.syspath_prepend(str(WINE))
    by_module = resolve("wine_task:task")
    for task in (by_file, by_module):
        assert task.name == "wine" and task.classes == ("cultivar-1", "cultivar-2", "cultivar-3")
        assert task.size() == {"model_parameters": 13 * 32 + 32 + 32 * 3 + 3, "model_macs_per_sample": 13 * 32 + 32 * 3}
    assert resolve("digits") is SHIPPED["digits"]


@pytest.mark.parametrize(("name", "says"), [
    ("nosuch", "choose one of fmnist, hapt, digits"),
    ("no_such_module_here:task", "cannot import no_such_module_here: ModuleNotFoundError"),
    (f"{WINE / 'missing.py'}:task", "cannot import"),
    (f"{WINE / 'wine_task.py'}:model", "has no Task named 'model' (found function)"),
    (f"{WINE / 'wine_task.py'}:nothing", "has no Task named 'nothing' (found NoneType)"),
])
def test_a_task_that_cannot_be_had_is_one_line(name, says):
    with pytest.raises(ConfigError) as err:
        resolve(RunConfig.from_mapping({"dataset": name}).data.dataset)
    assert says in str(err.value) and "\n" not in str(err.value)


WINE_FLEET = """name = "wine-6"
target_accuracy = 0.9
[data]
dataset = "{task}"
partitioner = "iid"
[training]
rounds = 5
clients_per_round = 4
local_epochs = 2
round_timeout_s = 60.0
[dynamics]
dropout = 0.2
[[devices]]
board = "rpi4"
count = 3
network = "wifi"
[[devices]]
board = "phone-mid"
count = 3
network = "mobile"
"""


# A task file's start: the wine task, to vary with dataclasses.replace.
WINE_VARIANT = f"""import dataclasses, sys
sys.path.insert(0, {str(WINE)!r})
import wine_task
"""


def run_wine_fleet(folder: Path, task: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`edgesched simulate` of a wine fleet training `task`, run in `folder` as a user runs it."""
    (folder / "wine-6.toml").write_text(WINE_FLEET.format(task=task))
    return subprocess.run([sys.executable, "-m", "edgesched", "simulate", "--fleet", "wine-6.toml", "--engine",
                           "in-process", "--out", "run", *args], cwd=folder, capture_output=True, text=True,
                          timeout=300)


def simulate_wine(folder: Path, task: str, *args: str) -> dict[str, np.ndarray]:
    """A wine fleet's simulation of `task`; its final model."""
    done = run_wine_fleet(folder, task, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((folder / "run" / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.8, summary  # three cultivars: chance is a third
    with np.load(folder / "run" / "model.npz") as model:
        return {k: model[k] for k in model.files}


def test_an_own_task_trains_in_a_fleet_simulation_with_no_edit_to_edgesched(tmp_path):
    for name in ("wine_task.py", "wine.csv"):  # the user's folder: their task beside their fleet file
        shutil.copy(WINE / name, tmp_path / name)
    model = simulate_wine(tmp_path, "wine_task.py:task")
    assert {k: w.shape for k, w in model.items()} == {"0.weight": (32, 13), "0.bias": (32,),
                                                      "2.weight": (3, 32), "2.bias": (3,)}


@pytest.mark.parametrize(("change", "says"), [
    ("input_shape=(12,)", "its model cannot take one float32 sample shaped (12,): RuntimeError"),
    ("model=lambda: wine_task.model().double()", "got Float and Double"),
])
def test_a_model_that_cannot_take_its_declared_input_is_one_line(tmp_path, change, says):
    (tmp_path / "broken.py").write_text(WINE_VARIANT + f"task = dataclasses.replace(wine_task.task, {change})\n")
    done = run_wine_fleet(tmp_path, "broken.py:task")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("edgesched: error: task 'wine': ") and says in line


WINE_BATCH_NORM = WINE_VARIANT + """from torch import nn
def model():
    return nn.Sequential(nn.Linear(13, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
task = dataclasses.replace(wine_task.task, name="wine-bn", model=model)
"""


def assert_batch_norm_kept(model: dict[str, np.ndarray]) -> None:
    count = model["1.num_batches_tracked"]
    assert count.shape == () and count.dtype == np.int64 and count > 0
    assert model["1.running_var"].shape == (32,)


# BatchNorm's batch count is a 0-d int64 tensor, and numpy turns 0-d results into bare scalars.
@pytest.mark.parametrize("strategy", ["edgesched", "edgesched-compressed"])
def test_a_model_with_batch_norm_trains_in_a_simulation_plain_and_compressed(tmp_path, strategy):
    (tmp_path / "wine_bn.py").write_text(WINE_BATCH_NORM)
    assert_batch_norm_kept(simulate_wine(tmp_path, "wine_bn.py:task", "--strategy", strategy))


@pytest.mark.parametrize("compression", ["off", "adaptive"])
def test_a_model_with_batch_norm_trains_on_boards_plain_and_compressed(tmp_path, compression):
    (tmp_path / "wine_bn.py").write_text(WINE_BATCH_NORM)
    rows, nodes = _wine_rows(), {}
    for i, node in enumerate((101, 202, 303)):
        (tmp_path / f"node-{node}").mkdir()
        (tmp_path / f"node-{node}" / "data.csv").write_text("\n".join(rows[i::3]) + "\n")
        nodes[node] = {"device-id": f"board-{node}", "local-data": str(tmp_path / f"node-{node}")}
    cfg = RunConfig.from_mapping({"dataset": f"{tmp_path / 'wine_bn.py'}:task", "clients": 3, "rounds": 3,
                                  "strategy": "edgesched", "min-deadline": 0.01, "compression": compression})
    result = run_on_grid(LocalGrid(nodes), cfg, lambda *_: None, identify=True)
    assert result.stopped is None and len(result.rounds) == 3
    assert sum(isinstance(d, Arrived) for d in result.decisions) >= 6
    assert_batch_norm_kept(result.weights)


# --- a board's own data -------------------------------------------------------------------------


def test_the_three_layouts_read_the_same_samples(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(12, 8, 8)).astype(np.float32)
    y = np.arange(12) % 3
    classes = ("cat", "dog", "owl")
    (tmp_path / "npz").mkdir()
    np.savez(tmp_path / "npz" / "data.npz", x=x, y=y)
    (tmp_path / "csv").mkdir()
    lines = ["label," + ",".join(f"p{i}" for i in range(64))]
    lines += [f"{classes[label]}," + ",".join(str(int(v)) for v in sample.ravel())
              for sample, label in zip(x, y, strict=True)]
    (tmp_path / "csv" / "data.csv").write_text("\n".join(lines) + "\n")
    for i, (sample, label) in enumerate(zip(x, y, strict=True)):
        (tmp_path / "img" / classes[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(sample.astype(np.uint8), mode="L").save(tmp_path / "img" / classes[label] / f"{i:02d}.png")

    flat = local_data.read(tmp_path / "csv", classes, (64,))
    assert np.array_equal(flat[0].reshape(x.shape), x) and np.array_equal(flat[1], y)
    assert np.array_equal(local_data.read(tmp_path / "npz", classes, (8, 8))[0], x)
    images, labels = local_data.read(tmp_path / "img", classes, (8, 8))
    by_class = np.argsort(y, kind="stable")  # read class folder by class folder
    assert np.array_equal(images, x[by_class]) and np.array_equal(labels, y[by_class])
    assert [local_data.count(tmp_path / f) for f in ("npz", "csv", "img")] == [12, 12, 12]


@pytest.mark.parametrize(("layout", "says"), [
    ({}, "holds neither data.npz, data.csv nor a folder per class"),
    ({"data.csv": "cat,1,2,3\nbird,1,2,3\n"}, "label 'bird' is neither a class"),
    ({"data.csv": "cat,1,2,3\ndog,1,x,3\n"}, "sample 2: readings must be numbers"),
    ({"data.csv": "cat,1,2\ndog,1,2\n"}, "samples are shaped (2,), the task reads (3,)"),
    ({"data.csv": "7,1,2,3\n"}, "labels must be 0..2, found 7..7"),
    ({"bird/a.png": b"not an image"}, "not a class of the task"),
    ({"cat/a.png": b"not an image"}, "not a readable image"),
])
def test_a_bad_folder_is_one_line_naming_the_file(tmp_path, layout, says):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, content in layout.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    shape = (4, 4) if any(k.endswith(".png") for k in layout) else (3,)
    with pytest.raises(DataError) as err:
        local_data.read(folder, ("cat", "dog", "owl"), shape)
    assert says in str(err.value) and "\n" not in str(err.value)


def _message(message_type: str, content: RecordDict):
    metadata = Metadata(run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="",
                        group_id="1", created_at=time.time(), ttl=60, message_type=message_type)
    return make_message(metadata, content)


def test_a_board_declares_and_trains_its_own_data_without_any_public_data(tmp_path):
    folder = board_folders(tmp_path, 3)[1]
    node = {"device-id": "pi-b", "local-data": str(folder)}
    context = Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config={})
    answer = app(_message(MessageType.QUERY, RecordDict()), context)
    held = len(folder.joinpath("data.csv").read_text().splitlines())
    assert answer.content["device"]["samples"] == held == 59

    cfg = RunConfig.from_mapping({"dataset": WINE_TASK, "data-dir": str(tmp_path / "nowhere"), "clients": 3})
    model = resolve(WINE_TASK).build()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(job_config(cfg, 1, 0))})
    reply = app(_message(MessageType.TRAIN, content), context)
    assert not reply.has_error(), reply.error
    assert reply.content["metrics"]["num-examples"] == held and reply.content["metrics"]["steps"] == 2


def test_an_own_training_step_is_the_one_boards_run(tmp_path):
    task_file = tmp_path / "counted.py"
    task_file.write_text(WINE_VARIANT + """from edgesched.training import train
calls = []
def counted(model, x, y, **kw):
    calls.append(len(y))
    return train(model, x, y, **kw)
task = dataclasses.replace(wine_task.task, name="counted-wine", train=counted)
""")
    name = f"{task_file}:task"
    cfg = RunConfig.from_mapping({"dataset": name, "data-dir": str(WINE), "clients": 3})
    content = RecordDict({"arrays": ArrayRecord(resolve(name).build().state_dict()),
                          "config": ConfigRecord(job_config(cfg, 1, 2))})
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    reply = app(_message(MessageType.TRAIN, content), context)
    assert not reply.has_error(), reply.error
    assert sys.modules["edgesched_task_counted"].calls == [reply.content["metrics"]["num-examples"]]


def test_a_gateway_sizes_and_checks_each_board_by_its_own_data(tmp_path):
    """Three boards of very different sizes, their own data only; the gateway's run sends each
    job to a board, checks every reply against the size the board declared on joining, and ends
    with a model that knows the cultivars."""
    rows = _wine_rows()
    sizes = {101: 20, 202: 40, 303: 80}
    nodes = {}
    start = 0
    for node, size in sizes.items():
        folder = tmp_path / f"node-{node}"
        folder.mkdir()
        (folder / "data.csv").write_text("\n".join(rows[start:start + size]) + "\n")  # skewed: the file is sorted
        start += size
        nodes[node] = {"device-id": f"board-{node}", "local-data": str(folder)}
    cfg = RunConfig.from_mapping({"dataset": WINE_TASK, "clients": 3, "rounds": 6, "strategy": "edgesched",
                                  "local-epochs": 2, "lr": 0.05, "min-deadline": 0.01})
    grid = RepliesGrid(nodes)
    result = run_on_grid(grid, cfg, lambda *_: None, identify=True)
    assert result.stopped is None and len(result.rounds) == 6
    declared = {r.metadata.src_node_id: r.content["device"]["samples"] for r in grid.replies
                if r.metadata.message_type == MessageType.QUERY}
    trained = {(r.metadata.src_node_id, r.content["metrics"]["num-examples"]) for r in grid.replies
               if r.metadata.message_type == MessageType.TRAIN}
    assert declared == sizes and trained == set(sizes.items())
    assert not [d for d in result.decisions if isinstance(d, Lost)]  # no reply refused, none lost
    assert sum(isinstance(d, Arrived) for d in result.decisions) >= 6
    assert result.rounds[-1].accuracy > 0.8, [r.accuracy for r in result.rounds]


class RepliesGrid(LocalGrid):
    def __init__(self, nodes):
        super().__init__(nodes)
        self.replies = []

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        self.replies += replies
        return replies
