import torch
from torch import nn

from edgesched.macs import count_macs
from edgesched.tasks import model_size


def test_small_cnn_macs_match_a_hand_count():
    conv1 = 16 * 28 * 28 * (1 * 5 * 5)
    conv2 = 32 * 14 * 14 * (16 * 5 * 5)
    dense = 128 * 32 * 7 * 7 + 10 * 128
    assert model_size("fmnist") == {"model_parameters": 215_370, "model_macs_per_sample": conv1 + conv2 + dense}


def test_grouped_1d_convolutions_and_linear_layers():
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1, groups=2), nn.Flatten(), nn.Linear(8 * 10, 5))
    expected = 8 * 10 * (4 // 2) * 3 + 5 * 80
    assert count_macs(model, torch.zeros(4, 10)) == expected


def test_counting_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Linear(3, 2))
    model.train()
    count_macs(model, torch.zeros(3))
    assert model.training and not model[0]._forward_hooks
