import gzip

import numpy as np
import pytest

from edgesched import data
from edgesched.errors import DataError


def _write_idx(path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    payload = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(payload)


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_plain_and_gzipped(tmp_path, compress):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("x.gz" if compress else "x")
    _write_idx(path, arr, compress)
    assert np.array_equal(data.read_idx(path), arr)


def test_truncated_idx_is_a_clear_error(tmp_path):
    path = tmp_path / "x"
    _write_idx(path, np.zeros((4, 5), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DataError, match="truncated"):
        data.read_idx(path)


def test_missing_fmnist_folder_says_where_to_point(tmp_path):
    with pytest.raises(DataError, match="--data-dir"):
        data.load_fmnist(tmp_path)


def test_fmnist_loads_the_real_files(fmnist_dir):
    ds = data.load("fmnist", str(fmnist_dir))
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.x_train.dtype == np.float32
    assert np.array_equal(np.bincount(ds.y_train), np.full(10, 6000))
    assert abs(float(ds.x_train.mean())) < 0.05  # normalised


def test_hapt_windows_keep_all_30_users_in_train_and_test(hapt_dir):
    ds = data.load("hapt", str(hapt_dir))
    assert ds.x_train.shape[1:] == (6, 128) and ds.num_classes == 12
    assert set(np.unique(ds.groups)) == set(range(1, 31))
    assert ds.y_train.min() == 0 and ds.y_train.max() == 11
    share = len(ds.y_test) / (len(ds.y_train) + len(ds.y_test))
    assert 0.15 < share < 0.25


def test_hapt_test_set_holds_every_activity_in_proportion(hapt_dir):
    """Sessions follow a fixed protocol: a split by time alone would leave activities out."""
    ds = data.load("hapt", str(hapt_dir))
    train, test = np.bincount(ds.y_train, minlength=12), np.bincount(ds.y_test, minlength=12)
    assert (test[:6] > 0).all()  # the six activities
    share = test / (train + test)
    assert np.all(np.abs(share[:6] - 0.2) < 0.05)


def test_hapt_natural_partition_is_its_users(hapt_dir):
    from edgesched.partition import partition

    ds = data.load("hapt", str(hapt_dir))
    parts = partition(ds.y_train, ds.groups, "natural", 30, 0.5, seed=0)
    owners = [np.unique(ds.groups[p]) for p in parts]
    assert [o.tolist() for o in owners] == [[u] for u in range(1, 31)]


def test_hapt_needs_a_path():
    with pytest.raises(DataError, match="--data-dir"):
        data.load("hapt", None)


def test_digits_split_is_fixed():
    ds = data.load("digits")
    assert ds.x_train.shape == (1347, 64) and ds.x_test.shape == (450, 64)
