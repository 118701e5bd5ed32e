import numpy as np
import pytest

from edgesched import partition
from edgesched.errors import ConfigError


def _labels(n_per_class: int = 300, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


def _dominant_share(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean share of each client's most common label: 1/classes for IID, 1.0 for one class each."""
    return float(np.mean([np.bincount(labels[p]).max() / len(p) for p in parts]))


def test_iid_deals_near_equal_disjoint_shares():
    parts = partition.iid(1003, 10, np.random.default_rng(0))
    _assert_exact_cover(parts, 1003)
    assert {len(p) for p in parts} <= {100, 101}


def test_same_seed_same_split_other_seed_other_split():
    labels = _labels()
    a = partition.partition(labels, None, "dirichlet", 8, 0.5, seed=3)
    b = partition.partition(labels, None, "dirichlet", 8, 0.5, seed=3)
    c = partition.partition(labels, None, "dirichlet", 8, 0.5, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_covers_every_sample_and_respects_min_size():
    labels = _labels()
    parts = partition.dirichlet(labels, 10, 0.3, np.random.default_rng(1), min_size=20)
    _assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 20


def test_dirichlet_label_skew_grows_as_alpha_shrinks():
    labels = _labels()
    rng = np.random.default_rng
    iid_share = _dominant_share(partition.iid(len(labels), 10, rng(0)), labels)
    mild = _dominant_share(partition.dirichlet(labels, 10, 10.0, rng(0)), labels)
    skewed = _dominant_share(partition.dirichlet(labels, 10, 0.1, rng(0)), labels)
    assert iid_share < 0.2
    assert skewed > 0.5
    assert iid_share < mild < skewed


def test_natural_split_gives_one_partition_per_group():
    groups = np.array([3, 1, 3, 2, 1, 1])
    parts = partition.natural(groups)
    assert [groups[p].tolist() for p in parts] == [[1, 1, 1], [2], [3, 3]]


@pytest.mark.parametrize(
    ("scheme", "groups", "clients", "message"),
    [
        ("shards", None, 4, "unknown partitioner"),
        ("natural", None, 4, "needs a data set with groups"),
        ("natural", np.array([0, 1, 1]), 3, "has 2 groups"),
        ("iid", None, 0, "clients must be between"),
    ],
)
def test_bad_partition_requests_are_refused_with_a_reason(scheme, groups, clients, message):
    with pytest.raises(ConfigError, match=message):
        partition.partition(np.zeros(3, dtype=int), groups, scheme, clients, 0.5, seed=0)


def test_dirichlet_refuses_impossible_minimum():
    with pytest.raises(ConfigError, match="could not give each"):
        partition.dirichlet(_labels(5, 2), 5, 0.01, np.random.default_rng(0), min_size=2, max_tries=3)


def test_dirichlet_balanced_gives_a_thousand_clients_equal_skewed_shares():
    labels = _labels(6000)  # 60,000 samples, like Fashion-MNIST
    parts = partition.dirichlet_balanced(labels, 1000, 0.3, np.random.default_rng(0))
    _assert_exact_cover(parts, len(labels))
    assert {len(p) for p in parts} == {60}
    iid_share = _dominant_share(partition.iid(len(labels), 1000, np.random.default_rng(0)), labels)
    assert _dominant_share(parts, labels) > 2 * iid_share  # IID clients of 60 samples: ~0.2
    again = partition.dirichlet_balanced(labels, 1000, 0.3, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_dirichlet_balanced_skew_follows_alpha():
    labels = _labels()
    rng = np.random.default_rng
    mild = _dominant_share(partition.dirichlet_balanced(labels, 20, 100.0, rng(1)), labels)
    skewed = _dominant_share(partition.dirichlet_balanced(labels, 20, 0.1, rng(1)), labels)
    assert mild < 0.3 < 0.6 < skewed


def test_sampled_gives_a_fleet_larger_than_the_data_set_a_batch_each_with_every_sample_used():
    parts = partition.partition(_labels(), None, "sampled", 500, 0.3, seed=1)  # 3,000 samples, 500 devices
    assert len(parts) == 500 and {len(p) for p in parts} == {partition.SAMPLED_SHARE}
    used = np.concatenate(parts)
    assert used.min() >= 0 and used.max() < 3000
    assert len(np.unique(used)) == 3000  # whole shuffles dealt: every sample is someone's
    assert np.bincount(used).max() <= 6  # 16,000 shares over 3,000 samples: 5 or 6 each
    again = partition.partition(_labels(), None, "sampled", 500, 0.3, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_sampled_with_fewer_devices_than_samples_deals_disjoint_equal_shares():
    parts = partition.sampled(3000, 10, np.random.default_rng(0))
    _assert_exact_cover(parts, 3000)
