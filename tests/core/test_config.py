import pytest

from edgesched.config import RunConfig, parse_scheduler_keys
from edgesched.errors import ConfigError


def test_from_mapping_reads_kebab_case_and_coerces_strings():
    cfg = RunConfig.from_mapping({"dataset": "digits", "local-epochs": "3", "lr": "0.1", "fraction-train": 1})
    assert (cfg.dataset, cfg.local_epochs, cfg.lr, cfg.fraction_train) == ("digits", 3, 0.1, 1.0)


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), ("true", True), ("False", False)])
def test_switches_take_booleans_or_their_words(value, expected):
    assert RunConfig.from_mapping({"onnx-every-round": value}).onnx_every_round is expected


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"epochs": 2}, "'epochs'"),
        ({"rounds": "many"}, "rounds"),
        ({"rounds": 2.5}, "rounds"),
        ({"rounds": 0}, "rounds"),
        ({"fraction-train": 1.5}, "fraction-train"),
        ({"dataset": "cifar"}, "dataset"),
        ({"partitioner": "shards"}, "partitioner"),
        ({"lr": True}, "lr"),
        ({"onnx-every-round": "yes"}, "onnx-every-round"),
        ({"onnx-every-round": 1}, "onnx-every-round"),
        ({"broker": "tcp://gw:1883"}, "broker"),
        ({"max-epochs": 0}, "max-epochs"),
        ({"min-epochs": 3, "max-epochs": 2}, "min-epochs"),
    ],
)
def test_bad_values_name_their_key(values, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_mapping(values)


def test_resolved_fills_dataset_defaults():
    hapt = RunConfig(dataset="hapt", data_dir="/data/hapt").resolved()
    assert (hapt.partitioner, hapt.clients, hapt.local_epochs) == ("natural", 30, 5)
    assert RunConfig(dataset="hapt", local_epochs=2).resolved().local_epochs == 2
    fmnist = RunConfig().resolved()
    assert fmnist.data_dir == "/usr/share/datasets/fashion-mnist"
    assert (fmnist.partitioner, fmnist.local_epochs) == ("dirichlet", 1)


def test_fast_devices_may_train_twice_the_local_epochs_unless_told_otherwise():
    assert RunConfig(dataset="hapt").resolved().max_epochs == 10
    assert RunConfig(dataset="hapt", local_epochs=2).resolved().max_epochs == 4
    assert RunConfig(dataset="hapt", max_epochs=3).resolved().max_epochs == 3
    with pytest.raises(ConfigError, match="min-epochs"):  # checked against the default once it is known
        RunConfig(min_epochs=2.5).resolved()


def test_mapping_round_trip():
    cfg = RunConfig(dataset="digits", clients=7, rounds=3).resolved()
    assert RunConfig.from_mapping(cfg.to_mapping()) == cfg


def test_scheduler_settings_change_a_fleet_run_and_nothing_else():
    from edgesched.simulations.fleet import load_fleet

    spec = load_fleet("lab-20")
    keys = parse_scheduler_keys("min-round-share=1.0 max-staleness='2' large-update=refuse")
    tuned = spec.with_overrides(scheduler=keys)
    assert (tuned.run.min_round_share, tuned.run.max_staleness, tuned.run.large_update) == (1.0, 2, "refuse")
    assert tuned.run.with_keys({"min-round-share": 0.5, "max-staleness": 3, "large-update": "clip"}) == spec.run


@pytest.mark.parametrize(("text", "says"), [
    ("lr=1", "'lr' is not a scheduler setting"),  # training settings belong to the fleet file
    ("min-round-share", "is not key=value"),
    ("max-staleness=", "is not key=value"),
])
def test_scheduler_settings_are_refused_by_name(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_scheduler_keys(text)
