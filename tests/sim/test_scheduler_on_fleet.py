"""The adaptive scheduler on the engine over a virtual fleet, without Ray: executors are in-process ClientApps.

Devices vanish mid-job; rounds still end and the model still learns. The same seed gives the
same bytes whether the devices' heartbeats travel in-process or through a real MQTT broker.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from edgesched import data, partition
from edgesched.broker import EmbeddedBroker
from edgesched.core import policies
from edgesched.core.decisions import Lost, Selected, decision_from_json
from edgesched.core.engine import Engine, EngineState
from edgesched.core.events import event_from_json
from edgesched.core.predict import Predictor
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.clock import EventLog, VirtualClock
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import load_fleet
from edgesched.simulations.heartbeats import InProcessBus, MqttBus, RegistryFleetView, VirtualTelemetry
from edgesched.simulations.transport import Executors, VirtualTransport
from edgesched.tasks import build_model, model_size
from edgesched.training import evaluate

from ..grids import LocalGrid

FLEET = """
name = "bench"
seed = 2
target_accuracy = 0.9
[data]
dataset = "digits"
partitioner = "iid"
[training]
rounds = 8
clients_per_round = 8
lr = 0.05
round_timeout_s = 120
[dynamics]
dropout = {dropout}
background_load = 0.2
[[devices]]
board = "rpi4"
count = 8
network = "wifi"
[[devices]]
board = "phone-mid"
count = 8
network = "mobile"
online_s = 600
offline_s = 300
"""


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def run(tmp_path, dropout: float, bus=None, rounds: int = 8):
    path = tmp_path / "bench.toml"
    path.write_text(FLEET.format(dropout=dropout))
    spec = load_fleet(str(path)).with_overrides(rounds=rounds, strategy="edgesched")
    cfg = spec.run
    ds = data.load("digits")
    sizes = [len(p) for p in partition.partition(ds.y_train, None, "iid", spec.size, cfg.data.alpha, cfg.seed)]
    size = model_size("digits")
    fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
    registry = DeviceRegistry(RegistryConfig(fleet=spec.name, heartbeat_interval=spec.dynamics.heartbeat_s))
    telemetry = VirtualTelemetry(fleet, registry, bus or InProcessBus())
    events = io.StringIO()
    clock = VirtualClock(fleet, telemetry, EventLog(events))
    clock.start()
    model = build_model("digits", cfg.seed)
    keys = list(model.state_dict())
    transport = VirtualTransport(fleet, cfg, sizes, clock, Executors(LocalGrid({901: {}, 902: {}}), 2), keys)

    def score(weights):
        import torch

        model.load_state_dict({k: torch.from_numpy(w) for k, w in zip(keys, weights, strict=True)})
        return evaluate(model, ds.x_test, ds.y_test)

    policy = policies.edgesched(cfg, Predictor(4 * size["model_parameters"]))
    records = []
    state = EngineState.start({k: v.numpy().copy() for k, v in model.state_dict().items()})
    Engine(policy, transport, clock, RegistryFleetView(telemetry, sizes), score,
           lambda record, jobs, model: records.append(record), lambda: 0.0).run(state, cfg.rounds)
    transport.finish()
    return state, records, policy.log, events.getvalue()


@pytest.mark.parametrize("dropout", [0.3, 0.5])
def test_devices_vanishing_mid_round_neither_stall_nor_diverge(tmp_path, dropout):
    state, records, log, _ = run(tmp_path, dropout)
    assert [r.round for r in records] == list(range(1, 9))  # every round ended
    lost = [e for e in log if isinstance(e, Lost)]
    jobs = [e for e in log if isinstance(e, Selected)]
    assert len(lost) >= (dropout - 0.15) * len(jobs)  # they really vanished
    assert all(r.replied >= 1 for r in records)
    starts = [0.0] + [r.virtual_seconds for r in records[:-1]]
    assert all(r.virtual_seconds - s < 2 * 120 for r, s in zip(records, starts, strict=True))  # no round stalls
    assert all(math.isfinite(r.loss) for r in records)
    assert records[-1].accuracy > 0.8 and records[-1].loss < records[0].loss  # learning, not diverging
    assert all(np.all(np.isfinite(w)) for w in state.model)


def test_same_seed_same_bytes_over_the_in_process_bus_and_a_real_broker(tmp_path):
    first = run(tmp_path, 0.3, rounds=3)
    again = run(tmp_path, 0.3, rounds=3)
    with EmbeddedBroker() as broker:
        bus = MqttBus(broker.url, "bench")
        try:
            over_mqtt = run(tmp_path, 0.3, bus=bus, rounds=3)
        finally:
            bus.close()
    for other in (again, over_mqtt):
        assert other[3] == first[3]  # events.jsonl, line for line
        assert other[2] == first[2]  # every decision
        for mine, theirs in zip(first[0].model, other[0].model, strict=True):
            assert mine.tobytes() == theirs.tobytes()
    assert '"event": "heartbeat"' in first[3] and '"event": "dropout"' in first[3]


def test_decisions_and_events_read_back_as_the_records_they_were(tmp_path):
    _, _, log, events = run(tmp_path, 0.3, rounds=3)
    assert [decision_from_json(d.to_json()) for d in log] == log
    lines = events.splitlines()
    assert [event.to_json(t) for t, event in map(event_from_json, lines)] == lines
