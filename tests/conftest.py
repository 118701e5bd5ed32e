"""Shared fixtures: where the real data lives, and skips where a machine lacks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesched.data import FMNIST_DIR

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def hapt_dir() -> Path:
    path = SHARED_DATA / "hapt"
    if not (path / "hapt_raw_by_user.npz").is_file():
        pytest.skip("UCI HAPT calibration data (../shared/data/hapt) is not on this machine")
    return path


@pytest.fixture(scope="session")
def fmnist_dir() -> Path:
    if not any(FMNIST_DIR.glob("train-images-idx3-ubyte*")):
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    return FMNIST_DIR
