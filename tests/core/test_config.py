import pytest

from edgesched.config import SCHEDULER_KEYS, RunConfig, SchedulerSettings, parse_scheduler_keys
from edgesched.errors import ConfigError


def test_from_mapping_reads_kebab_case_and_coerces_strings():
    cfg = RunConfig.from_mapping({"dataset": "digits", "local-epochs": "3", "lr": "0.1", "fraction-train": 1})
    assert (cfg.data.dataset, cfg.training.local_epochs, cfg.training.lr, cfg.fraction_train) == ("digits", 3, 0.1, 1.0)


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
        ({"lr": "nan"}, "lr"),
        ({"round-timeout": float("inf")}, "round-timeout"),
        ({"onnx-every-round": "yes"}, "onnx-every-round"),
        ({"onnx-every-round": 1}, "onnx-every-round"),
        ({"broker": "tcp://gw:1883"}, "broker"),
        ({"max-epochs": 0}, "max-epochs"),
        ({"local-epochs": 0}, "local-epochs"),
        ({"min-epochs": 3, "max-epochs": 2}, "min-epochs"),
        ({"min-deadline": 700}, "min-deadline"),
        ({"match-max-loss": 0}, "match-max-loss"),
        ({"match-max-loss": 1.5}, "match-max-loss"),
        ({"priced-max-loss": 0}, "priced-max-loss"),
        ({"priced-max-loss": 1.5}, "priced-max-loss"),
        ({"min-server-lr": 0}, "min-server-lr"),
        ({"pace-reward": "accuracy"}, "pace-reward"),
        ({"lossy-rounds-steps": 0}, "lossy-rounds-steps"),
    ],
)
def test_bad_values_name_their_key(values, key):
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_mapping(values)


def test_the_data_sets_defaults_fill_only_what_is_not_given():
    hapt = RunConfig.from_mapping({"dataset": "hapt", "data-dir": "/data/hapt"})
    assert (hapt.data.partitioner, hapt.data.clients, hapt.training.local_epochs) == ("natural", 30, 5)
    assert RunConfig.from_mapping({"dataset": "hapt", "local-epochs": 2}).training.local_epochs == 2
    fmnist = RunConfig.from_mapping({})
    assert fmnist.data.data_dir == "/usr/share/datasets/fashion-mnist"
    assert (fmnist.data.partitioner, fmnist.training.local_epochs) == ("dirichlet", 1)
    assert fmnist == RunConfig()  # the classes' own defaults are Fashion-MNIST's
    assert RunConfig.from_mapping({"data-dir": ""}).data.data_dir == "/usr/share/datasets/fashion-mnist"


def test_fast_devices_may_train_twice_the_local_epochs_unless_told_otherwise():
    assert RunConfig.from_mapping({"dataset": "hapt"}).scheduler.max_epochs == 10
    assert RunConfig.from_mapping({"dataset": "hapt", "local-epochs": 2}).scheduler.max_epochs == 4
    assert RunConfig.from_mapping({"dataset": "hapt", "max-epochs": 3}).scheduler.max_epochs == 3
    with pytest.raises(ConfigError, match="min-epochs"):  # checked against the default once it is known
        RunConfig.from_mapping({"min-epochs": 2.5})


def test_mapping_round_trip():
    cfg = RunConfig.from_mapping({"dataset": "digits", "clients": 7, "rounds": 3})
    assert RunConfig.from_mapping(cfg.to_mapping()) == cfg
    assert cfg.to_mapping()["clients"] == 7 and "data-dir" not in cfg.to_mapping()  # digits needs no folder


def test_the_scheduler_keys_are_the_scheduler_settings_fields():
    assert tuple(name.replace("_", "-") for name in SchedulerSettings.__dataclass_fields__) == SCHEDULER_KEYS
    assert "min-round-share" in SCHEDULER_KEYS and "lr" not in SCHEDULER_KEYS


def test_scheduler_settings_change_a_fleet_run_and_nothing_else():
    from edgesched.simulations.fleet import load_fleet

    spec = load_fleet("lab-20")
    keys = parse_scheduler_keys("min-round-share=1.0 max-staleness='2' large-update=refuse")
    tuned = spec.with_overrides(scheduler=keys)
    s = tuned.run.scheduler
    assert (s.min_round_share, s.max_staleness, s.large_update) == (1.0, 2, "refuse")
    assert tuned.run.with_keys({"min-round-share": 0.5, "max-staleness": 3, "large-update": "clip"}) == spec.run


@pytest.mark.parametrize(("text", "says"), [
    ("lr=1", "'lr' is not a scheduler setting"),  # training settings belong to the fleet file
    ("min-round-share", "is not key=value"),
    ("max-staleness=", "is not key=value"),
])
def test_scheduler_settings_are_refused_by_name(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_scheduler_keys(text)


def test_the_server_steps_floor_reaches_the_convergence_feedback():
    from edgesched.core.feedback import FeedbackConfig
    from edgesched.core.policies import scheduler_config

    assert scheduler_config(RunConfig()).feedback == FeedbackConfig()  # the default floor, 0.25
    assert scheduler_config(RunConfig.from_mapping({"min-server-lr": 1.0})).feedback.min_server_lr == 1.0
