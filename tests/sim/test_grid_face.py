"""The Grid that Flower's own strategies drive a virtual fleet through, in virtual time."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.simulations.catalog import load_catalog
from edgesched.simulations.clock import EventLog, VirtualClock
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import load_fleet
from edgesched.simulations.grid_face import FlowerGridFace
from edgesched.simulations.heartbeats import InProcessBus, VirtualTelemetry
from edgesched.simulations.transport import Executors, VirtualTransport
from edgesched.tasks import build_model, model_size

from ..grids import LocalGrid
from .test_fleet_file import GOOD

TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0


def _grid(tmp_path, dropout: float, seed: int = 3) -> tuple[FlowerGridFace, LocalGrid, io.StringIO]:
    path = tmp_path / "fleet.toml"
    path.write_text(GOOD.replace("count = 3", "count = 8").replace("clients_per_round = 2", "clients_per_round = 8"))
    spec = load_fleet(str(path)).with_overrides(seed=seed, dropout=dropout)
    spec = dataclasses.replace(spec, dynamics=dataclasses.replace(spec.dynamics, availability=False))
    size = model_size("digits")
    fleet = VirtualFleet(spec, load_catalog(), size["model_macs_per_sample"], 4 * size["model_parameters"])
    executors, events = LocalGrid({101: {}, 102: {}}), io.StringIO()
    telemetry = VirtualTelemetry(fleet, DeviceRegistry(RegistryConfig(fleet=spec.name)), InProcessBus())
    clock = VirtualClock(fleet, telemetry, EventLog(events))
    transport = VirtualTransport(fleet, spec.run, [130] * 8, clock, Executors(executors, 2),
                                 list(build_model("digits").state_dict()))
    return FlowerGridFace(transport, executors, per_round=8, seed=spec.run.seed), executors, events


def _messages(grid: FlowerGridFace) -> list[Message]:
    arrays = ArrayRecord(build_model("digits").state_dict())
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1, "lr": 0.05})})
    return [Message(content, dst_node_id=node, message_type=MessageType.TRAIN) for node in grid.get_node_ids()]


def test_dropped_devices_never_train_and_never_reply(tmp_path):
    grid, executors, events = _grid(tmp_path, dropout=0.5)
    replies = list(grid.send_and_receive(_messages(grid), timeout=TIMEOUT))
    log = [json.loads(line) for line in events.getvalue().splitlines()]
    dropped = {e["device"] for e in log if e["event"] == "dropout"}
    uploaded = {e["device"] for e in log if e["event"] == "upload"}
    assert dropped and uploaded and not dropped & uploaded
    trained = {int(m.content["config"]["partition-id"]) for m in executors.sent}
    replied = {int(r.content["metrics"]["partition-id"]) for r in replies}
    assert trained == replied == {int(d.rsplit("-", 1)[1]) for d in uploaded}
    assert grid.last.dropped == len(dropped) and grid.last.delivered == len(replies)
    assert grid._clock.now() == pytest.approx(TIMEOUT)  # someone dropped: the server waited to the deadline
    assert [e["t"] for e in log] == sorted(e["t"] for e in log)


def test_replies_come_in_virtual_arrival_order_and_the_round_ends_with_the_last(tmp_path):
    grid, _, events = _grid(tmp_path, dropout=0.0)
    replies = list(grid.send_and_receive(_messages(grid), timeout=TIMEOUT))
    log = [json.loads(line) for line in events.getvalue().splitlines()]
    uploads = [e for e in log if e["event"] == "upload"]
    assert [int(e["device"].rsplit("-", 1)[1]) for e in uploads] == \
        [int(r.content["metrics"]["partition-id"]) for r in replies]
    assert grid._clock.now() == pytest.approx(uploads[-1]["t"], abs=1e-6)  # the log keeps microseconds
    assert grid._clock.now() < TIMEOUT
    assert log[-1]["event"] == "round_end" and log[-1]["delivered"] == 8


def test_empty_rounds_cost_no_virtual_time(tmp_path):
    grid, _, events = _grid(tmp_path, dropout=0.0)
    assert list(grid.send_and_receive([], timeout=TIMEOUT)) == []
    assert grid._clock.now() == 0.0 and events.getvalue() == ""


def test_waits_in_virtual_time_until_enough_devices_are_online(tmp_path):
    grid, _, events = _grid(tmp_path, dropout=0.0)
    grid._per_round = 3
    for device in grid._transport.fleet.devices[:6]:  # only two are online now; the others come back later
        device.online, device.next_toggle = False, 500.0 + device.index
        device.group = dataclasses.replace(device.group, online_s=1e9)
    for device in grid._transport.fleet.devices[6:]:
        device.online, device.next_toggle = True, float("inf")
    online = list(grid.get_node_ids())
    assert len(online) == 3 and grid._clock.now() == 500.0
    assert json.loads(events.getvalue().splitlines()[-1]) == {"t": 500.0, "event": "idle"}


def test_candidates_are_drawn_once_per_round_from_the_seed(tmp_path):
    first, _, _ = _grid(tmp_path, dropout=0.0)
    first._per_round = 3
    offer = list(first.get_node_ids())
    assert len(offer) == 3 and list(first.get_node_ids()) == offer  # stable within the round
    again, _, _ = _grid(tmp_path, dropout=0.0)
    again._per_round = 3
    assert list(again.get_node_ids()) == offer  # the same seed offers the same devices


def test_a_device_busy_with_a_late_job_is_not_offered_again(tmp_path):
    grid, _, _ = _grid(tmp_path, dropout=0.0)
    replies = list(grid.send_and_receive(_messages(grid), timeout=1e-3))  # everyone is late
    assert replies == [] and grid.last.late == 8
    finish = sorted(((d.index, d.busy_until) for d in grid._transport.fleet.devices), key=lambda item: item[1])
    grid._per_round = 2
    offer = list(grid.get_node_ids())
    assert grid._clock.now() == finish[1][1]  # waited until the second device was free
    assert offer == sorted(device + 1 for device, _ in finish[:2])
