"""Count a model's multiply-accumulates per sample, by running it once with hooks.

The virtual fleet turns MACs into time (training ~ 3 x forward MACs: forward, and a backward
pass costing about twice the forward), so MACs are counted from the model itself rather than
written down: change the model and its simulated cost follows.
"""

from __future__ import annotations

import torch
from torch import nn


def count_macs(model: nn.Module, sample: torch.Tensor) -> int:
    """Forward MACs of `model` for one sample shaped like `sample` (no batch dimension).

    Counts convolutions (1-D and 2-D) and linear layers, which hold all but a sliver of the
    work in the models edgesched ships; pooling and activations are left out.
    """
    total = 0

    def conv(module: nn.Conv1d | nn.Conv2d, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        kernel = int(torch.tensor(module.kernel_size).prod())
        total += output[0].numel() * (module.in_channels // module.groups) * kernel

    def linear(module: nn.Linear, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += output[0].numel() * module.in_features

    hooks = []
    for module in model.modules():
        if isinstance(module, nn.Conv1d | nn.Conv2d):
            hooks.append(module.register_forward_hook(conv))
        elif isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(linear))
    try:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            model(sample.unsqueeze(0))
        model.train(was_training)
    finally:
        for hook in hooks:
            hook.remove()
    return total
