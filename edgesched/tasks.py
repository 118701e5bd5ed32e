"""What a fleet trains: a model, its data and its training step, together one `Task`.

edgesched ships three tasks (`fmnist`, `hapt`, `digits`); a user brings their own as a `Task`
in their own module and names it in the run config's `dataset` key, the way a Flower app names
its ClientApp: `dataset = "my_package.my_task:task"` (a module on the Python path of the gateway
and of every board), or `dataset = "/abs/path/my_task.py:task"` (a file at the same path on each
machine). Nothing in edgesched is edited. What the scheduler needs follows from the task itself:
parameters and multiply-accumulates per sample (the virtual clock's cost and the predictor's
priors) are counted from its model, work is sized in its mini-batch steps, its updates are
checked against its model's shapes, and its ONNX export starts with its `normalise`.

A board reads its own data (edgesched.local_data) as raw readings, which `normalise` turns
into model inputs; simulations and the gateway's evaluation set come from `load`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgesched import data, models, training
from edgesched.config import DATASETS, TASK_PATH
from edgesched.data import Dataset, Normalise
from edgesched.errors import ConfigError


@dataclass(frozen=True)
class Task:
    """A model, its data and how it trains.

    `model` builds a fresh model (its weights drawn from torch's seed, which `build` sets);
    `input_shape` is one sample as the model takes it; `classes` name the labels 0..n-1 (a board's
    image folders are named by them); `load(data_dir)` gives the data a simulation partitions and
    the gateway evaluates on; `normalise` turns a board's raw readings into model inputs (None:
    they are model inputs already). `train` and `evaluate` default to edgesched's SGD with
    momentum and cross-entropy scoring; a replacement keeps their signatures and reports."""

    name: str
    model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    classes: tuple[str, ...]
    load: Callable[[str | None], Dataset]
    normalise: Normalise | None = None
    train: Callable[..., training.TrainReport] = training.train
    evaluate: Callable[..., tuple[float, float]] = training.evaluate

    def build(self, seed: int = 0) -> nn.Module:
        """The model with weights drawn from `seed` (same seed, same weights)."""
        torch.manual_seed(seed)
        return self.model()

    @property
    def raw_shape(self) -> tuple[int, ...]:
        """One sample as a board reads it: the model's input before `normalise` adds a channel."""
        channel = self.normalise is not None and self.normalise.channel_axis
        return self.input_shape[1:] if channel else self.input_shape

    def size(self) -> dict[str, int]:
        """Parameters and forward MACs per sample: where sizing a model for a board starts."""
        from edgesched.macs import count_macs

        try:
            model = self.build()
            macs = count_macs(model, torch.zeros(self.input_shape))
        except Exception as exc:  # the user's model: why it cannot run is theirs to see, in one line
            raise ConfigError(f"task {self.name!r}: its model cannot take one float32 sample shaped "
                              f"{self.input_shape}: {type(exc).__name__}: {exc}") from None
        return {"model_parameters": sum(p.numel() for p in model.parameters()), "model_macs_per_sample": macs}


_DIGIT_NAMES = tuple(str(d) for d in range(10))
SHIPPED: dict[str, Task] = {
    "fmnist": Task("fmnist", models.SmallCNN, (1, 28, 28),
                   ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                    "ankle-boot"), lambda d: data.load("fmnist", d), data.FMNIST_NORMALISE),
    "hapt": Task("hapt", models.SensorCNN, (6, 128),
                 ("walking", "walking-upstairs", "walking-downstairs", "sitting", "standing", "laying",
                  "stand-to-sit", "sit-to-stand", "sit-to-lie", "lie-to-sit", "stand-to-lie", "lie-to-stand"),
                 lambda d: data.load("hapt", d), data.HAPT_NORMALISE),
    "digits": Task("digits", models.DigitsMLP, (64,), _DIGIT_NAMES, lambda d: data.load("digits", d),
                   data.DIGITS_NORMALISE),
}


@lru_cache(maxsize=8)
def resolve(name: str) -> Task:
    """The task a run config names: a shipped one, or `module:attribute` / `file.py:attribute`."""
    if name in SHIPPED:
        return SHIPPED[name]
    match = re.fullmatch(TASK_PATH, name)
    if match is None:
        raise ConfigError(f"dataset {name!r}: choose one of {', '.join(DATASETS)}, or name your own task "
                          f"as module:attribute or /path/to/file.py:attribute")
    where, attribute = match.group(1), match.group(2)
    module = _import(name, where)
    task = getattr(module, attribute, None)
    if not isinstance(task, Task):
        raise ConfigError(f"dataset {name!r}: {where} has no Task named {attribute!r} "
                          f"(found {type(task).__name__})")
    return task


def _import(name: str, where: str) -> Any:
    try:
        if where.endswith(".py"):
            path = Path(where)
            spec = importlib.util.spec_from_file_location(f"edgesched_task_{path.stem}", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ImportError(f"no such file {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(where)
    except Exception as exc:  # the user's module: any error it raises on import is theirs to see in one line
        raise ConfigError(f"dataset {name!r}: cannot import {where}: {type(exc).__name__}: {exc}") from None


@lru_cache(maxsize=4)
def load_data(name: str, data_dir: str | None) -> Dataset:
    """The task's data; cached per process because simulation workers reuse it."""
    return resolve(name).load(data_dir)


def build_model(name: str, seed: int = 0) -> nn.Module:
    """The task's model with weights drawn from `seed`."""
    return resolve(name).build(seed)


def model_size(name: str) -> dict[str, int]:
    return resolve(name).size()
