import numpy as np
import pytest

from edgesched.core.aggregate import Update, weighted_average
from edgesched.files import read_checkpoint, write_checkpoint


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


def test_an_update_waiting_for_its_step_survives_a_checkpoint(tmp_path):
    # A streamed update waits in the scheduler's buffer until its step; a checkpoint taken then
    # holds it, and the checkpoint reader (which loads only the classes of a run's state) must
    # read it back.
    update = Update([np.arange(3, dtype=np.float32)], samples=40, steps=5, staleness=1, bits=8)
    write_checkpoint(tmp_path / "state.bin", update)
    back = read_checkpoint(tmp_path / "state.bin", Update)
    np.testing.assert_array_equal(back.delta[0], update.delta[0])
    assert (back.samples, back.steps, back.staleness, back.bits) == (40, 5, 1, 8)
