"""The agent without a broker: what it imports, and what it keeps while disconnected."""

import subprocess
import sys

import psutil
import pytest

from edgesched.broker import free_port
from edgesched.clients import probes
from edgesched.clients.agent import Agent, AgentConfig
from edgesched.core.telemetry import Heartbeat
from edgesched.mqtt import BrokerURL


def test_the_agent_imports_neither_torch_nor_flower_nor_numpy():
    code = (
        "import sys; from edgesched import cli; from edgesched.clients import agent, probes; "
        "probes.read_resources(); probes.capabilities(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'ray', 'onnxruntime', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_disconnected_agent_keeps_only_the_newest_heartbeat():
    url = BrokerURL.parse(f"mqtt://127.0.0.1:{free_port()}")  # nothing listens there
    agent = Agent(AgentConfig(url, "pi-offline"))
    for _ in range(5):
        agent._beat()
    assert agent._pending is not None and agent._pending.seq == 5
    assert len(agent._client._out_messages) == 0  # nothing queued inside paho either


def test_probes_produce_a_valid_heartbeat_on_this_machine():
    hb = Heartbeat(device_id="here", session=1, seq=1, sent_at=1.0, **probes.read_resources())
    assert hb.mem_total_mb > 0 and hb.net_type in ("ethernet", "wifi", "cellular", "unknown")


@pytest.mark.parametrize(("name", "kind"), [("wlan0", "wifi"), ("eth0", "ethernet"), ("enp3s0", "ethernet"),
                                            ("wwan0", "cellular"), ("rmnet_data0", "cellular"), ("lo", "unknown")])
def test_interface_names_map_to_link_types(name, kind):
    assert probes.classify_interface(name) == kind


def test_default_route_decides_the_link_type(tmp_path):
    table = tmp_path / "route"
    table.write_text("Iface\tDestination\tGateway\nwlan0\t0000A8C0\t00000000\nwlan0\t00000000\t0101A8C0\n")
    assert probes.net_type(table) == "wifi"
    assert probes.net_type(tmp_path / "missing") == "unknown"


@pytest.mark.parametrize(
    ("url", "says"),
    [("http://gw:1883", "expected mqtt://"), ("mqtt://", "expected mqtt://"), ("mqtt://gw:99999", "broker URL")],
)
def test_bad_broker_urls_are_refused(url, says):
    from edgesched.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        BrokerURL.parse(url)


def test_broker_url_defaults_and_credentials(monkeypatch):
    monkeypatch.setenv("EDGESCHED_MQTT_PASSWORD", "from-env")
    plain = BrokerURL.parse("mqtt://gw")
    assert (plain.port, plain.tls, plain.password) == (1883, False, "from-env")
    tls = BrokerURL.parse("mqtts://pi%2D1:s3cret@gw.local")
    assert (tls.port, tls.tls, tls.username, tls.password) == (8883, True, "pi-1", "s3cret")


def test_the_shipped_placeholder_password_is_refused_and_a_clear_text_one_is_named(caplog):
    from edgesched.errors import ConfigError
    from edgesched.mqtt import make_client

    with pytest.raises(ConfigError, match="still the shipped placeholder 'change-me'"):
        make_client(BrokerURL.parse("mqtts://gateway:change-me@gw.local"), "gw")
    make_client(BrokerURL.parse("mqtt://pi-1:s3cret@127.0.0.1"), "a")  # loopback: nobody on the way
    make_client(BrokerURL.parse("mqtts://pi-1:s3cret@gw.local"), "b")
    assert not caplog.records
    make_client(BrokerURL.parse("mqtt://pi-1:s3cret@gw.local"), "c")
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "plain mqtt://" in caplog.records[0].message


def test_a_boards_state_never_falls_back_to_the_shared_temp_folder(tmp_path, monkeypatch):
    from edgesched.clients.job_report import job_report_path, state_dir, write_job_report

    for name in ("EDGESCHED_STATE_DIR", "XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert state_dir() == tmp_path / ".local" / "state" / "edgesched"
    write_job_report("pi-1", 100.0, 2.0)
    assert job_report_path("pi-1").parent.stat().st_mode & 0o777 == 0o700  # the board's user's alone


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_s_load_is_its_use_over_its_quota(tmp_path, version):
    """A board limited to half a core that used a quarter of a core over the last 2 s is 50 % busy."""
    from edgesched.clients.probes import CgroupCpu

    if version == "v1":
        group, accounting = tmp_path / "cpu" / "board", tmp_path / "cpuacct" / "board"
        accounting.mkdir(parents=True)
        group.mkdir(parents=True)
        (group / "cpu.cfs_quota_us").write_text("50000\n")
        (group / "cpu.cfs_period_us").write_text("100000\n")

        def used(seconds):
            (accounting / "cpuacct.usage").write_text(f"{int(seconds * 1e9)}\n")
    else:
        group = tmp_path / "board"
        group.mkdir()
        (group / "cpu.max").write_text("50000 100000\n")

        def used(seconds):
            (group / "cpu.stat").write_text(f"usage_usec {int(seconds * 1e6)}\nuser_usec 0\n")
    now = [100.0]
    used(10.0)
    cpu = CgroupCpu(group, clock=lambda: now[0])
    assert cpu.cores() == 0.5
    now[0], _ = 102.0, used(10.5)
    assert cpu.percent() == pytest.approx(50.0)
    now[0], _ = 104.0, used(10.5)
    assert cpu.percent() == 0.0


def test_the_load_a_board_reports_leaves_out_its_own_training(tmp_path, monkeypatch):
    """Heartbeats say what else competes with the next job: a job's process, from its start
    (imports included) to the interval in which it exited, is held out, and the last reading
    without it is repeated meanwhile."""
    import json

    from edgesched.clients.job_report import TrainingWatch, training_path

    monkeypatch.setenv("EDGESCHED_STATE_DIR", str(tmp_path))
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = psutil.Process(job.pid).create_time()
    try:
        watch = TrainingWatch("pi-1")
        assert watch.report(started - 3, started - 2, 10.0) == 10.0  # idle board, 10 % other work
        assert watch.report(started - 2, started + 0.5, 12.0) == 12.0  # the job's process starts in it
        training_path("pi-1").parent.mkdir(parents=True)
        training_path("pi-1").write_text(json.dumps({"pid": job.pid, "started": started}))
        assert watch.report(started + 0.5, started + 1, 100.0) == 10.0  # 12 % had the job's imports
        assert watch.report(started + 1, started + 2, 100.0) == 10.0
    finally:
        job.kill()
        job.wait()
    assert watch.report(started + 2, started + 3, 90.0) == 10.0  # it exited in this interval
    assert watch.report(started + 3, started + 4, 15.0) == 15.0  # idle again: the reading itself
