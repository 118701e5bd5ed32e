"""The round loop against a Grid stand-in that delivers each message to the real ClientApp.

Each node has its own node config (as `flower-supernode --node-config device-id=...` gives
it), so this checks per-client ConfigRecords and the device-id <-> node-id link without Ray.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, Error, Message
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from edgesched.config import RunConfig
from edgesched.core.decisions import Lost, Quarantined, RoundPlanned, Selected, Skipped
from edgesched.core.engine import Job
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.core.telemetry import Status, topic
from edgesched.errors import ConfigError
from edgesched.files import read_checkpoint, write_checkpoint
from edgesched.flower.nodes import FleetMemory, FlowerFleet
from edgesched.flower.run import run_on_grid
from edgesched.server.app import run_gateway
from edgesched.server.checkpoint import CHECKPOINT, GatewayCheckpoint

from ..grids import LocalGrid

NODES = {101: "pi4-a", 202: "pi5-b", 303: "jetson-c"}


class RecordingTelemetry:
    """What a run needs of a RegistryListener (link_node, snapshot, history), over a real registry."""

    def __init__(self, alive: list[str] | None = None) -> None:
        self.registry = DeviceRegistry(RegistryConfig())
        now = time.time()
        for device in NODES.values() if alive is None else alive:
            self.registry.ingest(topic("default", device, "status"), Status(device, "online", 1).to_json(), now)

    def link_node(self, device_id: str, node_id: int) -> None:
        self.registry.link_node(device_id, node_id)

    def snapshot(self):
        return self.registry.snapshot(time.time())

    def history(self, device_id: str):
        return self.registry.history(device_id)


@pytest.fixture(autouse=True)
def task_identity(tmp_path, monkeypatch):
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    monkeypatch.setenv("EDGESCHED_STATE_DIR", str(tmp_path))  # where the ClientApp leaves job speeds
    yield


NODE_CONFIGS = {node: {"device-id": device} for node, device in NODES.items()}


def adaptive(rounds: int, **over) -> RunConfig:
    """The adaptive scheduler on three digits clients; a round ends as soon as its jobs are in."""
    return RunConfig.from_mapping({"dataset": "digits", "clients": 3, "rounds": rounds, "lr": 0.05,
                                   "strategy": "edgesched", "min-deadline": 0.01, **over})


def test_each_node_gets_its_own_job_and_device_ids_are_linked(tmp_path):
    cfg = RunConfig.from_mapping({"dataset": "digits", "clients": 3, "rounds": 2, "local-epochs": 3, "lr": 0.05})
    grid = LocalGrid(NODE_CONFIGS)
    telemetry, rounds = RecordingTelemetry(), []
    result = run_on_grid(grid, cfg, lambda record, jobs, model: rounds.append((record, jobs)), telemetry)

    # Each node is first asked which device it is (so its Last Will can end its jobs), then trained.
    assert [m.metadata.message_type for m in grid.sent[:3]] == ["query"] * 3
    jobs = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(jobs) == 6
    first_round = [m.content["config"] for m in jobs[:3]]
    assert sorted(int(c["partition-id"]) for c in first_round) == [0, 1, 2]  # a different job per node
    assert {m.metadata.dst_node_id for m in jobs[:3]} == set(NODES)

    snapshot = telemetry.registry.snapshot(time.time())
    assert {d: snapshot.devices[d].node_id for d in NODES.values()} == {v: k for k, v in NODES.items()}
    jobs = rounds[-1][1]
    assert {(j.device_id, j.node_id) for j in jobs} == {(v, k) for k, v in NODES.items()}
    assert [r.round for r, _ in rounds] == [1, 2] and rounds[-1][0].accuracy > rounds[0][0].accuracy - 0.05
    assert set(result.weights) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    # Real boards leave their speed for the agent: one report per device id.
    assert {p.name for p in (tmp_path / "edgesched").glob("*.job.json")} == {f"{d}.job.json" for d in NODES.values()}


def test_the_adaptive_scheduler_runs_over_flower_push_and_pull():
    cfg = adaptive(rounds=4, **{"max-epochs": 5})
    grid = LocalGrid(NODE_CONFIGS)
    telemetry, rounds = RecordingTelemetry(), []
    result = run_on_grid(grid, cfg, lambda record, jobs, model: rounds.append((record, jobs)), telemetry)

    assert [r.round for r, _ in rounds] == [1, 2, 3, 4]
    assert all(r.replied >= 1 for r, _ in rounds) and rounds[-1][0].accuracy > 0.5
    configs = [m.content["config"] for m in grid.sent if m.metadata.message_type == "train"]
    assert all(int(c["max-steps"]) >= 1 and int(c["local-epochs"]) >= 1 for c in configs)  # the plan's work
    plans = [e for e in result.decisions if isinstance(e, Selected)]
    assert {e.device for e in plans} <= {f"node-{n}" for n in NODES}
    outcomes = [e.to_dict()["outcome"] for e in result.decisions if e.KIND == "outcome"]
    assert outcomes and all(outcome == "counted" for outcome in outcomes)
    # Replies named their devices: the registry now joins each device to its Flower node.
    snapshot = telemetry.registry.snapshot(time.time())
    assert {d: snapshot.devices[d].node_id for d in NODES.values()} == {v: k for k, v in NODES.items()}


def test_every_node_is_asked_its_device_before_its_first_job():
    """Its Last Will can end a job only if the gateway knows which node the device is."""
    grid, telemetry = LocalGrid(NODE_CONFIGS), RecordingTelemetry()
    fleet = FlowerFleet(grid, telemetry, sizes=[10, 10, 10])
    assert fleet.nodes() == sorted(NODES)
    assert [m.metadata.message_type for m in grid.sent] == ["query"] * 3
    fleet.nodes()  # the answers are taken in
    links = {d: s.node_id for d, s in telemetry.snapshot().devices.items()}
    assert links == {device: node for node, device in NODES.items()}
    assert len(grid.sent) == 3  # asked once


class FailedQueryGrid(LocalGrid):
    """Node 303 dies as its ClientApp starts to answer its first query: the reply is an error."""

    failed = False

    def pull_messages(self, message_ids):
        replies = []
        for reply in super().pull_messages(message_ids):
            asked = next(m for m in self.sent if m.metadata.message_id == reply.metadata.reply_to_message_id)
            if asked.metadata.message_type == "query" and asked.metadata.dst_node_id == 303 and not self.failed:
                self.failed = True
                reply = Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="the node is gone"), reply_to=asked)
            replies.append(reply)
        return replies


def test_a_node_whose_identification_failed_is_not_planned_blind_but_asked_again(monkeypatch):
    """Planned blind, a board that died while answering would hold its job until Flower noticed
    (about a minute); it waits to be asked again instead, and is planned once it answers."""
    monkeypatch.setattr("edgesched.flower.nodes.QUERY_RETRY_S", 0.2)
    grid, telemetry = FailedQueryGrid(NODE_CONFIGS), RecordingTelemetry()
    fleet = FlowerFleet(grid, telemetry, sizes=[10, 10, 10])
    fleet.nodes()
    assert {v.device for v in fleet.views(time.time())} == {"node-101", "node-202"}
    time.sleep(1.3)  # past the retry and the node list's reuse
    fleet.nodes()
    assert [m.metadata.dst_node_id for m in grid.sent].count(303) == 2
    assert {v.device for v in fleet.views(time.time())} == {f"node-{n}" for n in NODES}


def test_the_gateways_fleet_json_names_boards_by_device_and_marks_the_busy_ones():
    """A job out on node 202 (planned as node-202) shows its board, pi5-b, training; a node no
    agent speaks for is shown by node."""
    grid = LocalGrid({**NODE_CONFIGS, 404: {"device-id": "silent"}})
    telemetry = RecordingTelemetry()
    fleet = FlowerFleet(grid, telemetry, sizes=[10, 10, 10, 10])
    fleet.nodes()
    fleet.nodes()
    job = Job("j1", "node-202", 1, 1, 0.0)
    record = fleet.record([job], 1, time.time(), {"down": 5, "up": 0})
    states = {d["device"]: d["state"] for d in record["devices"]}
    assert states == {"pi4-a": "online", "pi5-b": "training", "jetson-c": "online", "node-404": "online"}
    assert record["bytes"] == {"down": 5, "up": 0}


class RefusingGrid(LocalGrid):
    """Flower refuses messages for one node (it left between planning and sending)."""

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.metadata.dst_node_id == 303 for m in messages):
            return []
        return super().push_messages(messages)


def test_a_message_flower_refuses_is_a_lost_job_not_a_crash():
    rounds = []
    # Rounds: each plans all three nodes, so each counts the refused one (streaming steps per two).
    result = run_on_grid(RefusingGrid(NODE_CONFIGS), adaptive(rounds=2, pace="rounds"),
                         lambda record, *_: rounds.append(record))
    refused = [e for e in result.decisions if isinstance(e, Lost)]
    assert refused and all(e.device == "node-303" and "refused" in e.reason for e in refused)
    assert [r.round for r in rounds] == [1, 2] and all(r.replied == 2 and r.failed == 1 for r in rounds)


class TamperingGrid(LocalGrid):
    """Node 303 runs a broken client build: in turn a NaN step count, NaN weights, a tensor too many."""

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.src_node_id == 303:
                self.broken = getattr(self, "broken", 0) + 1
                arrays, metrics = reply.content["arrays"], reply.content["metrics"]
                if self.broken % 3 == 1:
                    metrics["steps"] = float("nan")
                elif self.broken % 3 == 2:
                    first = next(iter(arrays))
                    arrays[first] = Array(np.full_like(arrays[first].numpy(), np.nan))
                else:
                    for k, a in list(arrays.items()):
                        arrays[f"{k}-copy"] = a
        return replies


def test_bad_replies_are_refused_counted_and_their_device_quarantined():
    rounds = []
    result = run_on_grid(TamperingGrid(NODE_CONFIGS), adaptive(rounds=5), lambda record, *_: rounds.append(record))

    refused = [e.reason for e in result.decisions if isinstance(e, Lost) and e.device == "node-303"]
    assert refused == ["refused: bad_metrics", "refused: not_finite", "refused: oversized"]
    assert [e.device for e in result.decisions if isinstance(e, Quarantined)] == ["node-303"]
    later = [e for e in result.decisions if isinstance(e, Selected | Skipped) and e.round > 3
             and e.device == "node-303"]
    assert later and all(isinstance(e, Skipped) and e.reason == "quarantined" for e in later)
    assert [r.round for r in rounds] == [1, 2, 3, 4, 5] and rounds[-1].accuracy > 0.5


class LyingGrid(LocalGrid):
    """Node 303 trains honestly but lies about its job, in turn: a billion steps (FedNova would
    scale its update up by them), 1e308 steps (to infinity), a billion examples (nearly all the
    weight of an average), another node's partition, more samples than its steps can hold."""

    LIES = ({"steps": 1e9}, {"steps": 1e308}, {"num-examples": 1e9}, {"partition-id": 0}, {"samples": 1e6})

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.metadata.src_node_id == 303 and "metrics" in reply.content:
                self.lies = getattr(self, "lies", -1) + 1
                reply.content["metrics"].update(self.LIES[self.lies % len(self.LIES)])
        return replies


def model_norm(weights) -> float:
    return float(np.sqrt(sum(np.sum(np.square(w, dtype=np.float64)) for w in weights.values())))


@pytest.mark.parametrize("strategy", ["edgesched", "fedavg"])
def test_a_device_lying_about_its_job_is_refused_and_moves_nothing(strategy):
    cfg = adaptive(rounds=5, strategy=strategy)
    honest = run_on_grid(LocalGrid(NODE_CONFIGS), cfg, lambda *_: None)
    lied = run_on_grid(LyingGrid(NODE_CONFIGS), cfg, lambda *_: None)

    assert all(np.all(np.isfinite(w)) for w in lied.weights.values())
    assert model_norm(lied.weights) < 1.5 * model_norm(honest.weights)
    assert lied.rounds[-1].accuracy > 0.5
    if strategy == "edgesched":  # the adaptive scheduler names each refusal and strikes the liar
        refused = [e.reason for e in lied.decisions if isinstance(e, Lost) and e.device == "node-303"]
        assert refused[:3] == ["refused: claims_steps", "refused: claims_steps", "refused: claims_examples"]
        assert [e.device for e in lied.decisions if isinstance(e, Quarantined)] == ["node-303"]
        assert not [e for e in lied.decisions if isinstance(e, Lost) and e.device != "node-303"]
    else:  # FedAvg: every round averages the two honest nodes alone
        assert all(r.replied == 2 and r.failed == 1 for r in lied.rounds)


class PowerCut(Exception):
    pass


def cut_at_round_3(record, jobs, model):
    if record.round == 3:
        raise PowerCut


def test_a_gateway_restarted_mid_run_goes_on_from_its_checkpoint(tmp_path):
    cfg = adaptive(rounds=4, **{"checkpoint-dir": str(tmp_path / "checkpoints")})  # made when first needed
    with pytest.raises(PowerCut):
        run_gateway(LocalGrid(NODE_CONFIGS), cfg, cut_at_round_3)
    with pytest.raises(ConfigError, match="holds a checkpoint of another run"):
        run_gateway(LocalGrid(NODE_CONFIGS), cfg.with_keys({"lr": 0.1}), cut_at_round_3)
    rounds = []
    result = run_gateway(LocalGrid(NODE_CONFIGS), cfg, lambda record, *_: rounds.append(record))
    assert [r.round for r in rounds] == [3, 4]  # round 2's checkpoint was the last one written
    assert max(e.round for e in result.decisions if isinstance(e, RoundPlanned)) == 4
    assert [e.round for e in result.decisions if isinstance(e, RoundPlanned)][:2] == [1, 2]  # the log goes on
    assert rounds[-1].accuracy > 0.5
    assert not (tmp_path / "checkpoints" / "gateway-checkpoint.bin").exists()


@pytest.mark.parametrize("format_field", ["older", "absent"])
def test_a_gateway_checkpoint_of_another_format_is_a_clear_error(tmp_path, format_field):
    """A gateway upgraded mid-run must not go on from classes pickled by another version."""
    cfg = adaptive(rounds=4, **{"checkpoint-dir": str(tmp_path)})
    with pytest.raises(PowerCut):
        run_gateway(LocalGrid(NODE_CONFIGS), cfg, cut_at_round_3)
    path = tmp_path / CHECKPOINT
    saved = read_checkpoint(path, GatewayCheckpoint)
    if format_field == "older":
        saved.format -= 1
    else:  # written before checkpoints had a format: the class default must not stand in for it
        del saved.__dict__["format"]
    write_checkpoint(path, saved)
    assert path.stat().st_mode & 0o777 == 0o600  # the gateway's own, as its model and fleet are
    with pytest.raises(ConfigError, match="written by another version of edgesched"):
        run_gateway(LocalGrid(NODE_CONFIGS), cfg, cut_at_round_3)


def test_decisions_jsonl_grows_as_the_gateway_run_goes(tmp_path):
    from edgesched.rundir import RunRecorder

    cfg = adaptive(rounds=3)
    recorder = RunRecorder(tmp_path / "run", cfg.to_mapping())
    seen: list[int] = []

    fleets: list[dict] = []

    def on_round(record, jobs, model):
        path = tmp_path / "run" / "decisions.jsonl"
        seen.append(len(path.read_text().splitlines()) if path.exists() else 0)
        fleets.append(json.loads((tmp_path / "run" / "fleet.json").read_text()))  # written before the step ended
        recorder.on_round(record, jobs, model)

    result = run_gateway(LocalGrid(NODE_CONFIGS), cfg, on_round, recorder=recorder)
    recorder.write_decisions(result.decisions)
    assert seen[0] == 0 and 0 < seen[1] < seen[2]  # each step's decisions are in before the next step ends
    # Without telemetry, the fleet is Flower's nodes, by node; one was out on its job when looked at
    assert {d["device"] for d in fleets[0]["devices"]} == {f"node-{n}" for n in NODE_CONFIGS}
    assert any(d["state"] == "training" for f in fleets for d in f["devices"])
    last = json.loads((tmp_path / "run" / "fleet.json").read_text())
    assert last["step"] == 3 and last["bytes"]["down"] > 0 and last["bytes"]["up"] > 0
    written = (tmp_path / "run" / "decisions.jsonl").read_text().splitlines()
    assert written == [d.to_json() for d in result.decisions]  # all of them, once, in order


class SilentGrid(LocalGrid):
    """Every board takes its first job and is never heard from again, though Flower still lists it."""

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg, msg_id in zip(messages, ids, strict=True):
            if msg.metadata.message_type == "train":
                del self._replies[msg_id]
        return ids


def test_a_run_whose_every_board_is_stuck_stops_with_its_model_and_its_checkpoint(tmp_path):
    """No board can take work for a whole round timeout: the run stops with a reason, and what it
    trained is kept, as is its checkpoint (started again, it goes on once boards are back)."""
    # In rounds, a round nobody can start ends the run; streaming, it steps on without updates.
    cfg = adaptive(rounds=4, pace="rounds",
                   **{"checkpoint-dir": str(tmp_path), "round-timeout": 3.0, "min-deadline": 0.5})
    result = run_gateway(SilentGrid(NODE_CONFIGS), cfg, lambda *_: None)
    assert result.stopped is not None and "no device could take work" in result.stopped
    # round 2 gave each silent board one more job beside its first; with two each out, none is left
    assert len(result.rounds) == 2 and set(result.weights) == {"net.0.weight", "net.0.bias", "net.2.weight",
                                                               "net.2.bias"}
    assert (tmp_path / CHECKPOINT).exists()


class SlowFirstJobGrid(LocalGrid):
    """Every board's first job takes `slow_s` (a loaded machine); later ones come at once."""

    def __init__(self, nodes, slow_s: float) -> None:
        super().__init__(nodes)
        self.slow_s = slow_s
        self._held: dict[str, float] = {}  # message id -> when its reply may be pulled
        self._trained: set[int] = set()

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg, msg_id in zip(messages, ids, strict=True):
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "train" and node not in self._trained:
                self._trained.add(node)
                self._held[msg_id] = time.monotonic() + self.slow_s
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        return super().pull_messages([i for i in message_ids if self._held.get(i, 0.0) <= now])


def test_boards_whose_jobs_outlast_the_round_timeout_get_new_work_and_the_run_goes_on(tmp_path):
    """Every board busy with a job far past its deadline: after a round timeout each is given new
    work beside it, and the run ends with all its rounds (it used to stop: no device could take work)."""
    cfg = adaptive(rounds=3, **{"round-timeout": 2.0, "min-deadline": 0.5})
    grid = SlowFirstJobGrid(NODE_CONFIGS, slow_s=6.0)
    result = run_gateway(grid, cfg, lambda *_: None)
    assert result.stopped is None and [r.round for r in result.rounds] == [1, 2, 3]
    assert result.rounds[0].replied == 0 and sum(r.replied for r in result.rounds[1:]) >= 3  # rounds 2-3 trained
    trains = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"]
    assert all(trains.count(node) >= 2 for node in NODES)  # each board took new work beside its slow job
    assert result.rounds[-1].accuracy > 0.3


class DeadNodeGrid(LocalGrid):
    """Flower still lists node 303 (it does for about a minute), but its board is dead: nothing
    sent to it is ever answered."""

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg, msg_id in zip(messages, ids, strict=True):
            if msg.metadata.dst_node_id == 303:
                del self._replies[msg_id]
        return ids


@pytest.mark.parametrize("will", ["retained", "lost with a broker restart"])
def test_a_restarted_gateway_knows_the_node_of_a_board_that_died_meanwhile(tmp_path, will):
    """Which node the board was, the dead node cannot answer, so the checkpoint must remember it.
    Its Last Will, if the broker kept it, says it is offline; if not, it is never heard again."""
    cfg = adaptive(rounds=4, **{"checkpoint-dir": str(tmp_path / "checkpoints")})
    with pytest.raises(PowerCut):
        run_gateway(LocalGrid(NODE_CONFIGS), cfg, cut_at_round_3, RecordingTelemetry())
    telemetry = RecordingTelemetry(alive=["pi4-a", "pi5-b"])  # the restarted gateway's registry
    if will == "retained":
        telemetry.registry.ingest(topic("default", "jetson-c", "status"),
                                  Status("jetson-c", "offline", 1).to_json(), time.time())
    grid, rounds = DeadNodeGrid(NODE_CONFIGS), []
    restarted = time.time()
    result = run_gateway(grid, cfg, lambda record, *_: rounds.append(record), telemetry)
    assert [r.round for r in rounds] == [3, 4]
    # (the log also holds what the stopped gateway planned before it went down: with overlap, its
    # last checkpoint came once round 3's first jobs were out)
    planned = [e.device for e in result.decisions if isinstance(e, Selected) and e.t >= restarted]
    assert planned and "node-303" not in planned
    assert 303 not in {m.metadata.dst_node_id for m in grid.sent}  # neither a job nor a query it cannot answer


def test_a_device_heard_before_a_restart_but_not_since_is_not_planned_and_is_named_in_the_log(caplog):
    telemetry = RecordingTelemetry(alive=["pi4-a", "pi5-b"])
    memory = FleetMemory(partitions={101: 0, 202: 1, 303: 2}, devices=dict(NODES), heard=set(NODES.values()))
    fleet = FlowerFleet(LocalGrid(NODE_CONFIGS), telemetry, sizes=[10, 10, 10], memory=memory)
    now = time.time()
    assert [v.device for v in fleet.views(now)] == ["node-101", "node-202"]
    assert "jetson-c" not in caplog.text  # a live agent is heard within a heartbeat: no alarm yet
    timeout = telemetry.registry.config.timeout
    assert [v.device for v in fleet.views(now + timeout + 1)] == ["node-101", "node-202"]
    assert "node 303 runs device 'jetson-c', whose agent has not been heard since the gateway restarted" in caplog.text


def test_a_node_whose_device_has_no_agent_is_planned_on_its_prior():
    """Flower's simulation, or boards run without agents: nothing is ever heard of them."""
    fleet = FlowerFleet(LocalGrid(NODE_CONFIGS), RecordingTelemetry(alive=[]), sizes=[10, 10, 10])
    fleet.nodes()  # asked, answered, joined to their device ids
    assert fleet.memory.devices == NODES
    assert [v.device for v in fleet.views(time.time())] == [f"node-{n}" for n in NODES]


def test_a_gateway_run_with_telemetry_writes_the_fleets_trace(tmp_path):
    from edgesched.rundir import RunRecorder
    from edgesched.server.app import TRACE_FILE
    from edgesched.tasks import model_size
    from edgesched.trace import TraceRecorder, load_trace

    cfg = adaptive(rounds=2)
    recorder = RunRecorder(tmp_path / "run", cfg.to_mapping())
    trace = TraceRecorder(model_size(cfg.data.dataset)["model_macs_per_sample"])
    seen: list[set[str]] = []

    def on_round(record, jobs, model):
        recorder.on_round(record, jobs, model)
        seen.append({j.device_id for j in jobs})

    started = time.time()
    run_gateway(LocalGrid(NODE_CONFIGS), cfg, on_round, RecordingTelemetry(), recorder, trace)
    path = tmp_path / "run" / TRACE_FILE
    assert path.read_text().startswith("# recorded by an edgesched gateway; 0 s is Unix time")
    recorded = load_trace(path)
    assert {d.device for d in recorded.devices} == set(NODES.values())
    assert 0 < recorded.period_s <= time.time() - started
    trained = set().union(*seen)
    assert trained and all(trace.jobs.get(device) for device in trained)  # each job that came back was timed
    for device in recorded.devices:  # online from when its node was known to the end, in one spell
        assert device.intervals[0].gmacs_per_s > 0 and device.intervals[-1].end_s == recorded.period_s
        assert all(a.end_s == b.start_s for a, b in zip(device.intervals, device.intervals[1:], strict=False))


def test_a_traced_device_is_online_from_when_the_gateway_can_send_it_work():
    """Its agent is heard first; until its Flower node is known, the gateway cannot use it."""
    from edgesched.trace import TraceRecorder

    trace = TraceRecorder(1000)
    fleet = FlowerFleet(LocalGrid(NODE_CONFIGS), RecordingTelemetry(), sizes=[10, 10, 10], trace=trace)
    fleet.views(time.time())  # the registry has them online; the nodes are asked who they are
    assert trace.origin is not None and not any(trace.spells.values())
    fleet.views(time.time())  # answered: each device linked to its node
    assert all(spells and spells[-1][1] == math.inf for spells in trace.spells.values())
    assert set(trace.spells) == set(NODES.values())


class LookedAtTelemetry(RecordingTelemetry):
    """Counts the gateway's looks at its fleet once `counting` is set; `looked` after two."""

    def __init__(self) -> None:
        super().__init__()
        self.counting, self.looked, self.looks = threading.Event(), threading.Event(), 0

    def snapshot(self):
        if self.counting.is_set():
            self.looks += 1
            if self.looks >= 2:
                self.looked.set()
        return super().snapshot()


class StalledPullGrid(LocalGrid):
    """Node 303's link drops mid-upload of its first reply: the pull that reaches it stalls, as
    Flower's does until the SuperLink's upload session expires (minutes), holding what it took,
    then gives an error for it. Node 202's board dies at that moment (its Last Will: offline) with
    its job unanswered. The stall ends once the gateway has looked at its fleet twice, or after
    STALL_S; `ended_by` says which."""

    STALL_S = 20.0

    def __init__(self, nodes, telemetry: LookedAtTelemetry) -> None:
        super().__init__(nodes)
        self.telemetry = telemetry
        self.stuck: Message | None = None
        self.ended_by, self.ended_at = "", math.inf

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg, msg_id in zip(messages, ids, strict=True):
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "train" and node == 303 and self.stuck is None:
                self.stuck = msg
            if msg.metadata.message_type == "train" and node == 202:
                del self._replies[msg_id]
        return ids

    def pull_messages(self, message_ids):
        ids = list(message_ids)
        stuck = self.stuck.metadata.message_id if self.stuck is not None else None
        taken = list(super().pull_messages([i for i in ids if i != stuck]))
        if stuck in ids and self._replies.pop(stuck, None) is not None:
            self.telemetry.registry.ingest(topic("default", "pi5-b", "status"),
                                           Status("pi5-b", "offline", 1).to_json(), time.time())
            self.telemetry.counting.set()
            self.ended_by = "looked at" if self.telemetry.looked.wait(self.STALL_S) else "timeout"
            self.ended_at = time.time()
            taken.append(Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                                       reason="Reply message objects are unavailable"), reply_to=self.stuck))
        return taken


def test_a_pull_stalled_on_a_broken_upload_does_not_stop_the_gateway_watching_its_fleet():
    """While Flower pulls a reply whose upload broke off, the gateway goes on looking at its fleet:
    a board that dies meanwhile has its job written off then, not once the pull gives up."""
    telemetry = LookedAtTelemetry()
    grid = StalledPullGrid(NODE_CONFIGS, telemetry)
    rounds = []
    result = run_on_grid(grid, adaptive(rounds=3), lambda record, *_: rounds.append(record), telemetry)
    assert grid.ended_by == "looked at"
    lost = {e.device: e for e in result.decisions if isinstance(e, Lost)}
    assert "offline" in lost["node-202"].reason and lost["node-202"].t < grid.ended_at
    assert "unavailable" in lost["node-303"].reason
    assert [r.round for r in rounds] == [1, 2, 3] and rounds[-1].accuracy > 0.5


class ForgetfulGrid(LocalGrid):
    """Compressed jobs through the real ClientApp; node 303 malforms its second reply (a scale it
    cannot have) and node 202 loses its kept models after its first job (a wiped state folder)."""

    def __init__(self, nodes, state: Path) -> None:
        super().__init__(nodes)
        self.state, self.replies = state, 0
        client_app = self._client_app

        def as_a_supernode(msg, context):  # an exception in the ClientApp comes back as an error reply
            try:
                return client_app(msg, context)
            except Exception as exc:
                return Message(Error(code=2, reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)

        self._client_app = as_a_supernode

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.has_error():
                continue
            self.replies += 1
            if reply.metadata.src_node_id == 303 and self.replies > 3 and not getattr(self, "malformed", False):
                self.malformed = True
                arrays = reply.content["arrays"]
                key = next(k for k in arrays if k.endswith("#scales"))
                arrays[key] = Array(np.full_like(arrays[key].numpy(), np.inf))
            if reply.metadata.src_node_id == 202 and not getattr(self, "wiped", False):
                self.wiped = True
                for held in (self.state / "edgesched" / "pi5-b").glob("run-*/held-*.npz"):
                    held.unlink()
        return replies


def test_compressed_jobs_go_down_as_differences_and_bad_ones_are_refused(tmp_path):
    grid = ForgetfulGrid(NODE_CONFIGS, tmp_path)
    rounds = []
    result = run_on_grid(grid, adaptive(rounds=4, compression="4"), lambda record, *_: rounds.append(record))
    assert [r.round for r in rounds] == [1, 2, 3, 4] and rounds[-1].accuracy > 0.5
    configs = [(m.metadata.dst_node_id, dict(m.content["config"])) for m in grid.sent]
    assert all(c["uplink-bits"] == 4 and c["downlink-bits"] == 8 for _, c in configs)
    bases = {node: [c["downlink-base"] for n, c in configs if n == node] for node in NODES}
    assert bases[101][0] == "" and all(b.startswith("node-101#") for b in bases[101][1:])  # differences after the first
    # 202 lost its copy: its job failed, and the next one brought the whole model again
    lost = [e.reason for e in result.decisions if isinstance(e, Lost) and e.device == "node-202"]
    assert len(lost) == 1 and "downlink base not held" in lost[0], lost
    assert bases[202][:3] == ["", bases[202][1], ""] and bases[202][1] != ""
    refused = [e.reason for e in result.decisions if isinstance(e, Lost) and e.device == "node-303"]
    assert refused == ["refused: malformed: scales must be finite and >= 0"], refused
