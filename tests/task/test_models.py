import pytest
import torch

from edgesched.tasks import build_model

CASES = {"fmnist": (1, 28, 28), "hapt": (6, 128), "digits": (64,)}


@pytest.mark.parametrize(("dataset", "shape"), CASES.items())
def test_forward_and_backward_shapes(dataset, shape):
    model = build_model(dataset)
    x = torch.randn(5, *shape)
    logits = model(x)
    assert logits.shape == (5, 12 if dataset == "hapt" else 10)
    logits.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.shape == p.shape for g, p in zip(grads, model.parameters(), strict=True))
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("dataset", CASES)
def test_models_are_edge_sized_and_seeded(dataset):
    a, b = build_model(dataset, seed=1), build_model(dataset, seed=1)
    assert sum(p.numel() for p in a.parameters()) < 500_000
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
