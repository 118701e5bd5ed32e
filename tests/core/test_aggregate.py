import numpy as np
import pytest

from edgesched.core.aggregate import weighted_average


def test_weighted_average_matches_hand_computation():
    a = [np.array([1.0, 2.0], dtype=np.float32), np.array([[0.0]], dtype=np.float32)]
    b = [np.array([3.0, 6.0], dtype=np.float32), np.array([[4.0]], dtype=np.float32)]
    avg = weighted_average([a, b], [1, 3])
    np.testing.assert_allclose(avg[0], [2.5, 5.0])
    np.testing.assert_allclose(avg[1], [[3.0]])
    assert avg[0].dtype == np.float32


@pytest.mark.parametrize(("updates", "weights"), [([], []), ([[np.zeros(1)]], [0.0]), ([[np.zeros(1)]], [-1.0])])
def test_weighted_average_refuses_degenerate_input(updates, weights):
    with pytest.raises(ValueError):
        weighted_average(updates, weights)
