"""Fleet traces: the CSV format and its errors, the recorder a gateway keeps, and replay on the
virtual fleet (online when the traced device was, at its speed, losing what its leaving cuts)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from edgesched.errors import ConfigError
from edgesched.simulations.catalog import TRAIN_MACS_PER_FORWARD_MAC, load_catalog
from edgesched.simulations.devices import VirtualFleet
from edgesched.simulations.fleet import load_fleet
from edgesched.trace import Interval, TraceRecorder, load_trace, write_trace

GOOD = """device,start_s,end_s,gmacs_per_s,overhead_s
pi-a,0,100,2.0,4
pi-a,150,300,1.0,6
pi-b,0,300,4.0,0
# a comment line, and a blank one

pi-c,50,60,1.5,2
"""


def test_a_trace_reads_each_device_as_its_intervals_in_order(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GOOD)
    trace = load_trace(path)
    assert [d.device for d in trace.devices] == ["pi-a", "pi-b", "pi-c"]
    a = trace.devices[0]
    assert a.intervals == (Interval(0, 100, 2.0, 4), Interval(150, 300, 1.0, 6))
    assert trace.period_s == 300 and a.online_share() == pytest.approx(250 / 300)
    assert a.online(99.9) and not a.online(100) and not a.online(120) and a.online(150)
    assert a.next_change(10) == 100 and a.next_change(100) == 150
    assert a.next_change(160) == a.next_change(300) == 400  # the trace repeats: online on through 300 (0) to 400
    assert trace.devices[1].next_change(5) == math.inf  # online the whole trace, every lap
    assert a.near(120).gmacs_per_s == 2.0  # offline: the speed of the last spell


def test_without_overhead_column_jobs_have_none(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("device,end_s,start_s,gmacs_per_s\npi-a,10,0,1\n")
    assert load_trace(path).devices[0].intervals == (Interval(0, 10, 1.0, 0.0),)


BAD = {
    "": "empty; a trace starts with the header",
    "device,start_s,gmacs_per_s\n": "line 1: header: no column 'end_s'",
    "device,start_s,end_s,gmacs_per_s,speed\n": "line 1: header: unknown column 'speed'",
    "device,start_s,end_s,gmacs_per_s,device\n": "line 1: header: a column named twice",
    "device,start_s,end_s,gmacs_per_s\n": "no rows after the header",
    "device,start_s,end_s,gmacs_per_s\npi-a,0,10\n": "line 2: 3 fields; the header has 4",
    "device,start_s,end_s,gmacs_per_s\npi/a,0,10,1\n": "line 2: device 'pi/a': 1-64 of letters",
    "device,start_s,end_s,gmacs_per_s\npi-a,zero,10,1\n": "line 2: start_s 'zero' is not a number",
    "device,start_s,end_s,gmacs_per_s\npi-a,0,nan,1\n": "line 2: end_s 'nan' is not a finite number",
    "device,start_s,end_s,gmacs_per_s\npi-a,-5,10,1\n": "line 2: start_s -5 is before the trace's start",
    "device,start_s,end_s,gmacs_per_s\npi-a,10,10,1\n": "line 2: end_s 10 is not after start_s 10",
    "device,start_s,end_s,gmacs_per_s\npi-a,0,10,0\n": "line 2: gmacs_per_s 0 must be > 0",
    "device,start_s,end_s,gmacs_per_s,overhead_s\npi-a,0,10,1,-1\n": "line 2: overhead_s -1 must be >= 0",
    "device,start_s,end_s,gmacs_per_s\npi-a,0,10,1\n\npi-a,5,20,1\n":
        "line 4: pi-a is already online then (line 2: 0 to 10 s)",
}


@pytest.mark.parametrize("text", BAD)
def test_each_malformed_trace_is_refused_with_its_line_and_fault(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}: ") and BAD[text] in str(err.value)
    assert "\n" not in str(err.value)


def test_a_bad_trace_on_the_command_line_is_one_line_and_exit_1(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"device,start_s,end_s,gmacs_per_s\n\xff\xfe,0,1,1\n")
    run = subprocess.run([sys.executable, "-m", "edgesched", "simulate", "--trace", str(path), "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip().count("\n") == 0, run.stderr
    assert run.stderr.startswith(f"edgesched: error: {path}: cannot read") and "Traceback" not in run.stderr


def test_replayed_devices_come_go_and_train_as_traced(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GOOD)
    fleet_file = tmp_path / "f.toml"
    fleet_file.write_text('name = "r"\ntarget_accuracy = 0.5\ntrace = "t.csv"\n[data]\ndataset = "digits"\n'
                          '[training]\nrounds = 1\nclients_per_round = 2\nround_timeout_s = 60\n')
    spec = load_fleet(str(fleet_file))
    assert spec.size == 3 and spec.run.data.clients == 3 and spec.groups == ()
    macs = 1_000_000
    fleet = VirtualFleet(spec, load_catalog(), macs, 10_000)
    assert fleet.online(0) == [0, 1] and fleet.online(55) == [0, 1, 2]
    job = fleet.job(0, 56.0, 200)  # on pi-a: 2 GMAC/s, 4 s of overhead
    assert job.download_s == job.upload_s == 2.0
    assert job.compute_s == pytest.approx(TRAIN_MACS_PER_FORWARD_MAC * macs * 200 / 2e9)
    assert job.delivers
    long = fleet.job(0, 90.0, 200_000)  # pi-a goes at 100: the job is lost then
    assert not long.delivers and long.cause == "offline" and long.drop_at == 100
    assert fleet.online(120) == [1]
    later = fleet.job(0, 200.0, 200)  # back at 150, at half the speed
    assert later.compute_s == pytest.approx(2 * job.compute_s) and later.download_s == 3.0


def test_a_trace_given_on_the_command_line_replaces_the_fleets_devices(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GOOD)
    spec = load_fleet("lab-20").with_overrides(trace=str(path))
    assert spec.size == 3 and spec.run.clients_per_round == 3 and spec.trace is not None
    fleet_file = tmp_path / "f.toml"
    fleet_file.write_text('target_accuracy = 0.5\ntrace = "t.csv"\n[data]\ndataset = "digits"\n'
                          '[training]\nrounds = 1\nclients_per_round = 2\nround_timeout_s = 60\n'
                          '[[devices]]\nboard = "rpi4"\ncount = 1\nnetwork = "wifi"\n')
    with pytest.raises(ConfigError, match="from \\[\\[devices\\]\\] or a trace, not both"):
        load_fleet(str(fleet_file))


def test_the_recorder_keeps_spells_and_speeds_and_bounds_what_devices_claim(tmp_path):
    macs = 1_000_000
    rec = TraceRecorder(macs)
    rec.presence("a", True, 1000.0)
    rec.presence("b", True, 1000.0)
    rec.job("a", 1010.0, 100, 2.0, 5.0)  # trained 100 samples in 2 of the 5 s the gateway measured
    rec.job("b", 1012.0, 100, -3.0, 4.0)  # a negative time: no speed to learn
    rec.job("a", 1014.0, 100, 50.0, 4.0)  # longer than the gateway measured: capped at 4 s
    rec.presence("a", False, 1020.0)
    rec.presence("a", False, 1021.0)
    rec.presence("a", True, 1030.0)
    rows = dict(rec.intervals(1050.0))
    speed = TRAIN_MACS_PER_FORWARD_MAC * macs * 100 / 1e9
    # a's first spell cut at its jobs' ends: each piece at its job's speed, the rest (one row) at the last one's
    assert rows["a"][:2] == [Interval(0, 10, pytest.approx(speed / 2), 3.0),
                             Interval(10, 20, pytest.approx(speed / 4), 0.0)]
    own = (speed / 2 + speed / 4) / 2  # its median, for a spell without a job
    assert rows["a"][2] == Interval(30, 50, pytest.approx(own), 1.5)
    assert rows["b"] == [Interval(0, 50, pytest.approx(own), 1.5)]  # no speed of its own: the fleet's median
    write_trace(tmp_path / "t.csv", rec.intervals(1050.0))
    assert load_trace(tmp_path / "t.csv").devices[0].intervals == tuple(
        Interval(i.start_s, i.end_s, pytest.approx(i.gmacs_per_s, rel=1e-5), i.overhead_s) for i in rows["a"])


def test_a_spell_ends_when_the_device_left_not_when_the_gateway_next_looked():
    rec = TraceRecorder(1_000_000)
    rec.presence("a", True, 0.0)
    rec.presence("b", True, 0.0)
    rec.job("b", 10.0, 100, 2.0, 5.0)  # a speed for the trace to give both
    rec.presence("a", False, 223.0, left_at=12.5)  # its Last Will came at 12.5 s; nobody looked till 223
    rec.presence("b", False, 223.0)  # no moment known: the look dates it
    assert [(i.start_s, i.end_s) for i in dict(rec.intervals(300.0))["a"]] == [(0.0, 12.5)]
    assert [(i.start_s, i.end_s) for i in dict(rec.intervals(300.0))["b"]] == [(0.0, 223.0)]


def test_a_replayed_fleet_goes_into_a_checkpoint_and_back(tmp_path):
    from edgesched.files import read_checkpoint, write_checkpoint

    path = tmp_path / "t.csv"
    path.write_text(GOOD)
    spec = load_fleet("lab-20").with_overrides(trace=str(path))
    fleet = VirtualFleet(spec, load_catalog(), 1_000_000, 10_000)
    fleet.online(120.0)
    write_checkpoint(tmp_path / "c.bin", fleet)
    back = read_checkpoint(tmp_path / "c.bin", VirtualFleet)
    assert back.spec == spec and [d.trace for d in back.devices] == [d.trace for d in fleet.devices]
    assert back.online(160.0) == fleet.online(160.0) == [0, 1]


def test_a_job_still_out_past_its_time_slows_the_device_from_its_start():
    macs = 1_000_000
    speed = TRAIN_MACS_PER_FORWARD_MAC * macs * 100 / 1e9
    rec = TraceRecorder(macs)
    rec.presence("a", True, 0.0)
    rec.sent("j1", "a", 0.0, 100)
    rec.replied("j1", 5.0, 100, 1.0)  # 1 s of training, 4 of overhead
    rec.sent("j2", "a", 10.0, 100)  # at that speed, done by 15: still out at 20, and at 110
    assert dict(rec.intervals(12.0))["a"] == [Interval(0, 12, pytest.approx(speed), 4.0)]  # not overdue yet
    assert dict(rec.intervals(110.0))["a"] == [Interval(0, 10, pytest.approx(speed), 4.0),
                                               Interval(10, 110, pytest.approx(speed / 96), 4.0)]
    rec.presence("a", False, 111.0)  # gone: the job is lost with it, and says nothing of its speed
    assert dict(rec.intervals(120.0))["a"] == [Interval(0, 111, pytest.approx(speed), 4.0)]
