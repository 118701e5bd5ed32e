"""The run-directory reader behind the dashboard, /metrics and `edgesched status` (no server, no run)."""

from __future__ import annotations

import json

from edgesched.core.decisions import Arrived, Lost, Selected, Skipped
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.core.telemetry import Capabilities, Heartbeat, Status, topic
from edgesched.observe import FLEET_FILE, RunWatch, fleet_record

ROUND_HEADER = "round,accuracy,loss,train_loss,selected,replied,failed,samples,seconds,virtual_seconds\n"
JOB_HEADER = "round,partition,node_id,device_id,samples,steps,seconds,samples_per_second,loss\n"


def _registry(now: float) -> DeviceRegistry:
    registry = DeviceRegistry(RegistryConfig(fleet="f"))
    for i, device in enumerate(("pi-a", "pi-b", "pi-c")):
        session = int((now - 100) * 1000)
        registry.ingest(topic("f", device, "status"), Status(device, "online", session).to_json(), now - 50)
        registry.ingest(topic("f", device, "capabilities"),
                        Capabilities(device, "rpi4", 4, 4096.0, "linux", "3.11").to_json(), now - 50)
        registry.ingest(topic("f", device, "heartbeat"),
                        Heartbeat(device, session, 1, now - 1 - 10 * i, 10.0, 0.5, 1000.0, 4096.0, temp_c=70.0 + i,
                                  throttled=i == 1).to_json(), now - 1 - 10 * i)
    registry.ingest(topic("f", "pi-a", "heartbeat"), b"{not json", now)
    registry.link_node("pi-b", 7)
    return registry


def test_fleet_record_says_each_devices_state_and_the_drops():
    now = 1_800_000_000.0
    record = fleet_record(_registry(now).snapshot(now), {"pi-a"}, now, 4, [("node-9", True)],
                          {"down": 10, "up": 5})
    states = {d["device"]: d["state"] for d in record["devices"]}
    assert states == {"pi-a": "training", "pi-b": "online", "pi-c": "offline", "node-9": "training"}
    pi_b = next(d for d in record["devices"] if d["device"] == "pi-b")
    assert (pi_b["board"], pi_b["node"], pi_b["temp_c"], pi_b["throttled"]) == ("rpi4", 7, 71.0, True)
    assert sum(record["heartbeats"]["dropped"].values()) == 1 and record["heartbeats"]["accepted"] == 9
    assert record["bytes"] == {"down": 10, "up": 5} and record["step"] == 4
    json.dumps(record)  # it is written as JSON as it is


def _decisions(path, *records):
    with path.open("a") as f:
        for d in records:
            f.write(d.to_json() + "\n")


def test_watch_reads_what_is_appended_joins_gateway_names_and_starts_over_when_cut_back(tmp_path):
    now = 1_800_000_000.0
    (tmp_path / "config.json").write_text(json.dumps({"strategy": "edgesched", "rounds": 3, "fleet": "f"}))
    (tmp_path / FLEET_FILE).write_text(json.dumps(fleet_record(_registry(now).snapshot(now), set(), now, 1)))
    rounds = tmp_path / "rounds.csv"
    rounds.write_text(ROUND_HEADER + "1,0.5,1.2,1.5,3,2,1,1000,10.0,\n2,0.6,")  # the second row half-written
    (tmp_path / "jobs.csv").write_text(JOB_HEADER + "1,0,7,pi-b,500,8,2.0,250.0,1.4\n")
    _decisions(tmp_path / "decisions.jsonl",
               Selected(1.0, 1, "node-7", 500, 8, 1, 3.0, 2.5, 0, 1, 0.1, 1.0),
               Skipped(1.0, 1, "pi-c", "battery"),
               Arrived(4.0, 1, "node-7", "counted", 1, 0, 1, 3.0, 2.0, 0.25, 500),
               Lost(5.0, 1, "pi-a", "device offline", 1))
    watch = RunWatch(tmp_path)
    assert watch.refresh()
    view = watch.view()
    assert view["run"]["step"] == 1 and view["run"]["status"] == "running" and view["run"]["clock"] == "wall"
    assert view["accuracy"]["accuracy"] == [0.5]
    pi_b = next(d for d in view["devices"] if d["device"] == "pi-b")  # the decisions' node-7 is pi-b
    assert (pi_b["predicted_s"], pi_b["actual_s"], pi_b["counted"], pi_b["last"]) == (2.5, 2.0, 1, "counted")
    assert next(d for d in view["devices"] if d["device"] == "pi-c")["last"] == "skipped: battery"
    assert view["jobs"] == {"sent": 3, "counted": 1, "failed": 1, "late": 0, "lost": {"device offline": 1}}
    assert view["prediction_error"] == 0.25
    assert [s["outcome"] for s in view["timeline"]] == ["delivered"]
    assert not watch.refresh()  # nothing new

    with rounds.open("a") as f:
        f.write("0.4,1.1,3,3,0,1200,20.0,\n")  # the half row completed
    assert watch.refresh()
    assert watch.view()["run"]["step"] == 2

    rounds.write_text(ROUND_HEADER + "1,0.5,1.2,1.5,3,2,1,1000,10.0,\n")  # a resumed run cut its logs back
    (tmp_path / "jobs.csv").write_text(JOB_HEADER)
    assert watch.refresh()
    view = watch.view()
    assert view["run"]["step"] == 1 and view["jobs"]["counted"] == 0
    assert view["jobs"]["lost"] == {"device offline": 1}  # decisions.jsonl, still whole, read again once

    events = tmp_path / "events.jsonl"  # a virtual fleet's: the timeline comes from it, not the decisions
    dispatch = '{"t": 1.0, "event": "dispatch", "round": 1, "device": "pi-a"}\n'
    events.write_text(dispatch + '{"t": 2.0, "event": "upload", "round": 1, "device": "pi-a"}\n'
                      + dispatch.replace("1.0", "3.0").replace('"round": 1', '"round": 2'))
    assert watch.refresh()
    pi_a = [(s["start"], s["end"]) for s in watch.view()["timeline"] if s["device"] == "pi-a"]
    assert pi_a == [(1.0, 2.0), (3.0, None)]
    events.write_text(dispatch)  # cut back alone (killed mid-step after its checkpoint): read anew, not doubled
    assert watch.refresh()
    assert [(s["start"], s["end"]) for s in watch.view()["timeline"]] == [(1.0, None)]

    (tmp_path / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
    assert watch.refresh() and watch.view()["run"]["status"] == "finished"


def test_watch_of_a_directory_with_nothing_yet(tmp_path):
    watch = RunWatch(tmp_path)
    watch.refresh()
    view = watch.view()
    assert view["run"]["step"] == 0 and view["devices"] == [] and view["accuracy"]["t"] == []


def test_a_gateways_unix_times_are_shown_from_its_first_decision(tmp_path):
    start = 1_800_000_000.0
    (tmp_path / "rounds.csv").write_text(ROUND_HEADER + "1,0.5,1.2,1.5,1,1,0,500,9.0,\n")
    _decisions(tmp_path / "decisions.jsonl",
               Selected(start, 1, "node-7", 500, 8, 1, 3.0, 2.5, 0, 1, 0.1, 1.0),
               Arrived(start + 4.0, 1, "node-7", "counted", 1, 0, 1, 3.0, 4.0, -0.375, 500),
               Selected(start + 5.0, 2, "node-7", 500, 8, 1, 3.0, 2.5, 0, 1, 0.1, 1.0))
    (tmp_path / FLEET_FILE).write_text(json.dumps({"t": start + 9.0, "step": 1, "devices": [],
                                                   "heartbeats": {"accepted": 0, "dropped": {}}}))
    watch = RunWatch(tmp_path)
    watch.refresh()
    view = watch.view()
    assert [(s["start"], s["end"], s["outcome"]) for s in view["timeline"]] == [(0.0, 4.0, "delivered"),
                                                                              (5.0, None, "running")]
    assert view["timeline_now"] == 9.0 and [d["t"] for d in view["decisions"]] == [5.0, 4.0, 0.0]  # newest first


def test_a_fleet_file_that_is_slow_to_write_waits_longer_before_the_next_one_between_steps(tmp_path, monkeypatch):
    """fleet.json's pause between steps grows with what it cost (a 100,000-device file takes
    seconds); a step's end still writes it. The clock is rundir's own, stepped by hand."""
    from edgesched import rundir

    clock = [100.0]
    monkeypatch.setattr(rundir.time, "monotonic", lambda: clock[0])
    recorder = rundir.RunRecorder(tmp_path / "run", {})
    written: list[float] = []

    def record(cost_s: float):
        def build() -> dict:
            written.append(clock[0])
            clock[0] += cost_s  # the write takes this long
            return {"t": clock[0]}
        return build

    recorder.write_fleet(record(0.01), settled=False)
    clock[0] += rundir.FLEET_EVERY_S
    recorder.write_fleet(record(2.0), settled=False)  # a cheap file: a second later it is written again
    clock[0] += 10.0
    recorder.write_fleet(record(2.0), settled=False)  # 10 s after a 2 s write: not yet (18 s)
    recorder.write_fleet(record(2.0), settled=True)  # the step ended: written
    assert written == [100.0, 101.01, 113.01]
    clock[0] += 2.0 * rundir.FLEET_COST_SHARE
    recorder.write_fleet(record(0.01), settled=False)
    assert len(written) == 4
