import torch

from edgesched import data
from edgesched.tasks import build_model
from edgesched.training import evaluate, train


def test_training_learns_and_reports_consistent_timing():
    ds = data.load("digits")
    model = build_model("digits", seed=0)
    _, before = evaluate(model, ds.x_test, ds.y_test)
    report = train(model, ds.x_train, ds.y_train, epochs=3, batch_size=32, lr=0.05, seed=0)
    _, after = evaluate(model, ds.x_test, ds.y_test)
    assert after > before + 0.3
    assert report.samples == 3 * len(ds.y_train)
    assert report.steps == 3 * -(-len(ds.y_train) // 32)
    assert report.seconds > 0
    assert abs(report.samples_per_second - report.samples / report.seconds) < 1e-6 * report.samples_per_second


def test_max_steps_caps_the_work():
    ds = data.load("digits")
    report = train(build_model("digits"), ds.x_train, ds.y_train, epochs=5, batch_size=10, lr=0.01, seed=0, max_steps=7)
    assert (report.steps, report.samples) == (7, 70)


def test_same_seed_same_weights():
    ds = data.load("digits")
    states = []
    for _ in range(2):
        model = build_model("digits", seed=2)
        train(model, ds.x_train, ds.y_train, epochs=1, batch_size=16, lr=0.05, seed=9)
        states.append(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(states[0].values(), states[1].values(), strict=True))


def test_a_proximal_term_keeps_the_weights_near_where_they_started():
    ds = data.load("digits")
    drift = {}
    for mu in (0.0, 1.0):
        model = build_model("digits", seed=1)
        start = [p.detach().clone() for p in model.parameters()]
        train(model, ds.x_train, ds.y_train, epochs=2, batch_size=32, lr=0.05, seed=3, proximal_mu=mu)
        drift[mu] = sum(float(((p.detach() - p0) ** 2).sum()) for p, p0 in zip(model.parameters(), start, strict=True))
    assert drift[1.0] < 0.7 * drift[0.0]
