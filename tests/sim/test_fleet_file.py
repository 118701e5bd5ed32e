"""Fleet files: the shipped ones load; a bad one names the file and the key."""

import pytest

from edgesched.errors import ConfigError
from edgesched.simulations.fleet import FLEETS, load_fleet

GOOD = """
name = "t"
target_accuracy = 0.8
[data]
dataset = "digits"
[training]
rounds = 2
clients_per_round = 2
round_timeout_s = 60
[[devices]]
board = "rpi4"
count = 3
network = "wifi"
"""


@pytest.mark.parametrize(("name", "size"), [("lab-20", 20), ("campus-100", 100), ("phones-1000", 1000),
                                           ("hapt-30", 30), ("replay", 4)])
def test_shipped_fleets_load(name, size):
    fleet = load_fleet(name)
    assert fleet.size == size and fleet.run.data.clients == size
    assert 0 < fleet.target_accuracy <= 1
    boards = {g.board for g in fleet.groups}
    if name.startswith("lab"):
        assert boards <= {"rpi4", "rpi5", "jetson-nano", "jetson-xavier-nx", "jetson-orin-nano"}


def test_every_shipped_fleet_file_is_named_in_the_folder():
    assert {p.stem for p in FLEETS.glob("*.toml")} == {"lab-20", "campus-100", "phones-1000", "hapt-30", "mixed-24",
                                                        "replay"}


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (('board = "rpi4"', 'board = "rpi9"'), "devices[0].board: unknown board"),
        (("count = 3", "count = 0"), "devices[0].count: must be >= 1"),
        (("count = 3", 'count = "3"'), "devices[0].count: expected int"),
        (("rounds = 2\n", ""), "training.rounds: missing"),
        (("clients_per_round = 2", "clients_per_round = 9"), "training.clients_per_round: must be between 1 and"),
        (('dataset = "digits"', 'dataset = "cifar"'), "dataset: unknown 'cifar'"),
        (("[data]", "[data]\nshuffle = true"), "data.shuffle: unknown key"),
        (("target_accuracy = 0.8", "target_accuracy = 80"), "target_accuracy: in (0, 1]"),
        (('network = "wifi"', 'network = "5g"'), "devices[0].network: unknown network"),
        (("[training]", "[training"), "not valid TOML"),
        (("[data]", 'trace = "t.csv"\n[data]'), "trace: a fleet's devices come from [[devices]] or a trace, not both"),
    ],
)
def test_a_bad_fleet_file_names_the_file_and_the_key(tmp_path, edit, says):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(ConfigError) as info:
        load_fleet(str(path))
    assert str(info.value).startswith(f"{path}: ") and says in str(info.value)


def test_unknown_fleet_names_the_shipped_ones():
    with pytest.raises(ConfigError, match="shipped fleets: campus-100, hapt-30, lab-20, mixed-24, phones-1000, replay"):
        load_fleet("garage-3")


def test_overrides():
    fleet = load_fleet("lab-20").with_overrides(seed=5, rounds=2, dropout=0.3)
    assert (fleet.seed, fleet.run.seed, fleet.run.rounds, fleet.dynamics.dropout) == (5, 5, 2, 0.3)
    with pytest.raises(ConfigError, match="--dropout"):
        load_fleet("lab-20").with_overrides(dropout=1.5)
