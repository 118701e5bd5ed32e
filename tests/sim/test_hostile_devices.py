"""Hostile devices on a virtual fleet: the same devices misbehave at every job, and the engine
refuses what the gateway can see is a lie."""

from __future__ import annotations

import json

import pytest
from flwr.supercore.task_identity import TaskIdentity

from edgesched.errors import ConfigError
from edgesched.simulations import fleet_run
from edgesched.simulations.fleet import load_fleet

from .test_resume import FLEET


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def hostile_fleet(tmp_path, attack: str, share: float = 0.25):
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.replace("[dynamics]\n", f"[dynamics]\nmalicious = {share}\nattack = \"{attack}\"\n")
                    .replace("dropout = 0.3", "dropout = 0.0"))
    return load_fleet(str(path))


@pytest.mark.parametrize(("attack", "reason"), [("lie-steps", "claims_steps"), ("lie-examples", "claims_examples"),
                                                 ("nan", "not_finite")])
def test_every_update_of_a_hostile_device_is_refused_for_what_it_is(tmp_path, attack, reason):
    spec = hostile_fleet(tmp_path, attack).with_overrides(rounds=2, strategy="edgesched")
    summary = fleet_run.simulate_fleet(spec, tmp_path / "run", engine="in-process")
    lost = [json.loads(line) for line in (tmp_path / "run" / "decisions.jsonl").open()
            if '"lost"' in line and "refused" in line]
    assert summary["refused_updates"] == {reason: len(lost)} and lost
    assert len({d["device"] for d in lost}) <= 2  # a quarter of 8 devices: the same two every time
    assert summary["final_accuracy"] > 0.5


def test_an_unknown_attack_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"dynamics\.attack: one of sign-flip, scale, nan, lie-steps, lie-examples"):
        hostile_fleet(tmp_path, "bribe")
