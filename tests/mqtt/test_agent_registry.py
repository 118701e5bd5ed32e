"""Agents as real processes, brokers as real servers, the registry on the gateway side."""

from __future__ import annotations

import json
import signal
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.clients.job_report import job_report_path, write_job_report
from edgesched.core.telemetry import topic

from ..core.heartbeats import heartbeat
from .brokers import make_test_ca, password_file, shipped_config
from .conftest import KEEPALIVE, wait_until

pytestmark = pytest.mark.slow


def _device(listener, device_id):
    return listener.snapshot().devices.get(device_id)


def _online_with_beats(listener, device_id, beats: int = 2):
    def check() -> bool:
        d = _device(listener, device_id)
        return bool(d and d.online and d.heartbeat and d.heartbeat.seq >= beats and d.capabilities)
    return check


def test_heartbeats_reach_the_registry(broker, listen, agents, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESCHED_STATE_DIR", str(tmp_path))
    write_job_report("pi-1", samples_per_s=321.0, job_s=12.5)  # as the ClientApp leaves it
    assert job_report_path("pi-1").parent == tmp_path / "edgesched"
    listener = listen(broker.url)
    agents(broker.url, "pi-1")
    wait_until(_online_with_beats(listener, "pi-1", 3), 15, "three heartbeats from pi-1")
    device = _device(listener, "pi-1")
    assert device.heartbeat.train_samples_per_s == 321.0 and device.heartbeat.last_job_s == 12.5
    assert device.heartbeat.mem_total_mb > 0 and device.capabilities.cores >= 1
    assert device.heartbeat.rtt_ms is not None and device.heartbeat.rtt_ms < 1000
    assert listener.snapshot().dropped == {}


def test_the_agents_speed_test_reaches_the_registry_with_its_capabilities(broker, listen, agents):
    listener = listen(broker.url)
    agents(broker.url, "pi-fast", "--speed-test", "digits")
    wait_until(_online_with_beats(listener, "pi-fast", 1), 60, "pi-fast online after its speed test")
    caps = _device(listener, "pi-fast").capabilities
    assert caps.speedtest_model == "digits" and caps.speedtest_infer_sps > 100


def test_sigkill_is_marked_offline_by_the_last_will(broker, listen, agents):
    listener = listen(broker.url)
    proc = agents(broker.url, "pi-kill")
    wait_until(_online_with_beats(listener, "pi-kill"), 15, "pi-kill online")
    proc.send_signal(signal.SIGKILL)
    took = wait_until(lambda: not _device(listener, "pi-kill").online, 1.5 * KEEPALIVE + 3, "offline after SIGKILL")
    assert _device(listener, "pi-kill").offline_reason == "status"  # the Will, not a heartbeat timeout
    print(f"offline {took:.2f} s after SIGKILL (keepalive {KEEPALIVE} s)")


def _freeze(proc, listener, device_id, timeout) -> float:
    """SIGSTOP keeps the socket open but silent, as a board whose link goes dark."""
    proc.send_signal(signal.SIGSTOP)
    try:
        return wait_until(lambda: not _device(listener, device_id).online, timeout, f"{device_id} offline when silent")
    finally:
        proc.send_signal(signal.SIGCONT)


def test_a_dark_link_fires_the_will_within_the_keepalive_bound(mosquitto_factory, listen, agents):
    server = mosquitto_factory("allow_anonymous true\n")
    listener = listen(server.url)
    proc = agents(server.url, "pi-dark")
    wait_until(_online_with_beats(listener, "pi-dark"), 15, "pi-dark online")
    took = _freeze(proc, listener, "pi-dark", 1.5 * KEEPALIVE + 3)
    assert _device(listener, "pi-dark").offline_reason == "status"  # the Will, from the broker
    print(f"Will {took:.2f} s after the link went silent (keepalive {KEEPALIVE} s)")


def test_a_dark_link_times_out_in_the_registry(broker, listen, agents):
    """The registry's own bound, 2.5 heartbeat intervals: the only one with the embedded broker,
    which (amqtt 0.12.1) does not enforce keepalive and so never fires a silent client's Will."""
    listener = listen(broker.url, heartbeat_interval=0.3)
    proc = agents(broker.url, "pi-silent")
    wait_until(_online_with_beats(listener, "pi-silent"), 15, "pi-silent online")
    took = _freeze(proc, listener, "pi-silent", 0.75 + 2)
    assert _device(listener, "pi-silent").offline_reason == "timeout"
    print(f"timed out {took:.2f} s after the last heartbeat window")


def test_sigterm_is_offline_at_once_and_exits_zero(broker, listen, agents):
    listener = listen(broker.url)
    proc = agents(broker.url, "pi-term")
    wait_until(_online_with_beats(listener, "pi-term"), 15, "pi-term online")
    proc.send_signal(signal.SIGTERM)
    took = wait_until(lambda: not _device(listener, "pi-term").online, 2.0, "offline after SIGTERM")
    assert proc.wait(timeout=10) == 0
    assert took < 1.5 * KEEPALIVE  # faster than any Will could be


def test_broker_restart_is_survived_by_agent_and_registry(broker, listen, agents):
    listener = listen(broker.url)
    proc = agents(broker.url, "pi-restart")
    wait_until(_online_with_beats(listener, "pi-restart"), 15, "pi-restart online")
    before = _device(listener, "pi-restart").heartbeat.seq
    broker.restart(down_seconds=2.0)
    took = wait_until(lambda: _device(listener, "pi-restart").heartbeat.seq > before + 3, 20,
                      "heartbeats after the broker restart")
    assert proc.poll() is None and listener.connected and listener.connections >= 2
    # The disconnected agent kept only its newest heartbeat: the gap in seq is visible,
    # but no backlog was replayed (seq values arrive increasing, none refused as replayed).
    assert listener.snapshot().dropped.get("replayed", 0) == 0
    print(f"state back {took:.1f} s after the broker came back")


def _rogue_client(url_port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"rogue-{time.monotonic_ns()}")
    client.connect("127.0.0.1", url_port)
    client.loop_start()
    return client


def test_registry_refuses_a_payload_naming_another_device(broker, listen):
    listener = listen(broker.url)
    rogue = _rogue_client(broker.port)
    try:
        forged = heartbeat("pi-attacker", sent_at=time.time()).to_json()
        rogue.publish(topic("default", "pi-victim", "heartbeat"), forged, qos=1).wait_for_publish(5)
        wait_until(lambda: listener.snapshot().dropped.get("id_mismatch") == 1, 5, "id_mismatch counted")
        assert "pi-victim" not in listener.snapshot().devices
    finally:
        rogue.loop_stop()
        rogue.disconnect()


def test_shipped_config_tls_passwords_and_acl(mosquitto_factory, listen, agents, tmp_path):
    """A device may publish only under its own id; the broker drops anything else."""
    password_file(tmp_path, {"gateway": "gw-secret", "pi-a": "a-secret"})
    server = mosquitto_factory(shipped_config(tmp_path), tls=True)
    ca = str(tmp_path / "ca.crt")
    listener = listen(server.url, username="gateway", password="gw-secret", ca_file=ca)
    agents(server.url, "pi-a", "--username", "pi-a", "--ca-file", ca, password="a-secret")
    wait_until(_online_with_beats(listener, "pi-a"), 15, "pi-a online through TLS, password and ACL")
    rogue = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rogue")
    rogue.username_pw_set("pi-a", "a-secret")  # pi-a's own credentials...
    rogue.tls_set(ca_certs=ca)
    rogue.connect("localhost", server.port)
    rogue.loop_start()
    try:
        forged = heartbeat("pi-b", sent_at=time.time()).to_json()
        rogue.publish(topic("default", "pi-b", "heartbeat"), forged, qos=1).wait_for_publish(5)  # ...pi-b's topic
        rogue.publish(topic("default", "pi-a", "status"), json.dumps({"v": 1, "x": 1}).encode(),
                      qos=1).wait_for_publish(5)
        wait_until(lambda: listener.snapshot().dropped.get("bad_schema") == 1, 5, "pi-a's own topic still open")
        assert "pi-b" not in listener.snapshot().devices  # the broker dropped it
    finally:
        rogue.loop_stop()
        rogue.disconnect()
    wrong = agents(server.url, "pi-c", "--username", "pi-c", "--ca-file", ca, password="guess")
    time.sleep(1.5)
    assert "pi-c" not in listener.snapshot().devices and wrong.poll() is None  # refused, still retrying


def test_shipped_config_binds_each_login_to_its_own_client_id(mosquitto_factory, listen, agents, tmp_path):
    """An enrolled device that connects under another device's (or the gateway's) MQTT client id
    must not disconnect it: the broker gives every device connection its login as client id."""
    password_file(tmp_path, {"gateway": "gw-secret", "pi-a": "a-secret", "pi-b": "b-secret", "pi-c": "c-secret"})
    server = mosquitto_factory(shipped_config(tmp_path), tls=True)
    ca = str(tmp_path / "ca.crt")
    listener = listen(server.url, username="gateway", password="gw-secret", ca_file=ca)
    agents(server.url, "pi-a", "--username", "pi-a", "--ca-file", ca, password="a-secret")
    wait_until(_online_with_beats(listener, "pi-a"), 15, "pi-a online")
    rogues = []
    for login, stolen in (("pi-b", "edgesched-agent-default-pi-a"), ("pi-c", listener._client._client_id.decode())):
        rogue = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=stolen)
        rogue.username_pw_set(login, f"{login[-1]}-secret")  # an enrolled device, with its own login
        rogue.tls_set(ca_certs=ca)
        rogue.connect("localhost", server.port)
        rogue.loop_start()
        rogues.append(rogue)
    try:
        wait_until(lambda: all(r.is_connected() for r in rogues), 5, "the rogue connections up")
        time.sleep(2.0)
        device = _device(listener, "pi-a")
        assert device.online and listener.connected  # no Last Will fired, nobody was thrown off
        assert "Client edgesched-agent-default-pi-a already connected" not in (tmp_path / "mosquitto.log").read_text()
    finally:
        for rogue in rogues:
            rogue.loop_stop()
            rogue.disconnect()


def test_a_boards_login_reads_no_other_devices_telemetry(mosquitto_factory, listen, agents, tmp_path):
    """With only its bundle (the CA, its own login), a board subscribes to everything and hears nothing."""
    password_file(tmp_path, {"gateway": "gw-secret", "pi-a": "a-secret", "pi-b": "b-secret"})
    server = mosquitto_factory(shipped_config(tmp_path), tls=True)
    ca = str(tmp_path / "ca.crt")
    heard: list[str] = []
    spy = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="spy")
    spy.username_pw_set("pi-b", "b-secret")
    spy.tls_set(ca_certs=ca)
    spy.on_message = lambda client, userdata, msg: heard.append(msg.topic)
    spy.on_connect = lambda client, *_: client.subscribe([("#", 1), ("edgesched/v1/#", 1), ("$SYS/#", 1)])
    spy.connect("localhost", server.port)
    spy.loop_start()
    try:
        listener = listen(server.url, username="gateway", password="gw-secret", ca_file=ca)
        agents(server.url, "pi-a", "--username", "pi-a", "--ca-file", ca, password="a-secret")
        wait_until(_online_with_beats(listener, "pi-a", 3), 15, "pi-a heard by the gateway")
        assert spy.is_connected() and heard == []  # retained status and capabilities included
    finally:
        spy.loop_stop()
        spy.disconnect()


def test_tls_with_a_test_ca(mosquitto_factory, listen, agents, tmp_path):
    certs = make_test_ca(tmp_path)
    conf = f"allow_anonymous true\ncafile {certs['ca']}\ncertfile {certs['cert']}\nkeyfile {certs['key']}\n"
    server = mosquitto_factory(conf, tls=True)
    assert server.url.startswith("mqtts://")
    listener = listen(server.url, ca_file=str(certs["ca"]))
    agents(server.url, "pi-tls", "--ca-file", str(certs["ca"]))
    wait_until(_online_with_beats(listener, "pi-tls"), 15, "pi-tls online over TLS")


def test_gateway_telemetry_opens_from_the_run_config(broker, agents):
    from edgesched.config import TelemetrySettings
    from edgesched.server.telemetry import open_telemetry

    with open_telemetry(TelemetrySettings(broker="none")) as none:
        assert none is None
    with open_telemetry(TelemetrySettings(broker=broker.url, fleet="lab", heartbeat_interval=0.3)) as listener:
        agents(broker.url, "pi-lab", "--fleet", "lab")
        wait_until(_online_with_beats(listener, "pi-lab"), 15, "pi-lab online in fleet lab")


def test_the_gateway_default_is_the_embedded_broker_on_loopback(agents):
    import socket

    from edgesched.config import TelemetrySettings
    from edgesched.server.telemetry import EMBEDDED_PORT, open_telemetry

    try:
        socket.create_server(("127.0.0.1", EMBEDDED_PORT)).close()
    except OSError:
        pytest.skip(f"port {EMBEDDED_PORT} is in use on this machine")
    assert TelemetrySettings().broker == "embedded"
    with open_telemetry(TelemetrySettings(heartbeat_interval=0.3)) as listener:
        agents(f"mqtt://127.0.0.1:{EMBEDDED_PORT}", "pi-default")
        wait_until(_online_with_beats(listener, "pi-default"), 15, "pi-default online via the embedded broker")


@pytest.mark.parametrize("broker", ["mosquitto"], indirect=True)
def test_a_broker_down_for_10_s_leaves_the_fleet_on_its_last_known_state(broker, listen, agents):
    listener = listen(broker.url, heartbeat_interval=0.3)  # devices time out after 0.75 s of silence
    proc = agents(broker.url, "pi-outage")
    wait_until(_online_with_beats(listener, "pi-outage"), 15, "pi-outage online")
    broker.stop()
    wait_until(lambda: not listener.connected, 5, "the gateway noticing the broker is gone")
    time.sleep(10.0)
    during = _device(listener, "pi-outage")
    assert during.online and during.stale  # still schedulable, on what was last heard
    before = during.heartbeat.seq
    broker.start()
    wait_until(lambda: _device(listener, "pi-outage").heartbeat.seq > before, 30, "heartbeats after the outage")
    after = _device(listener, "pi-outage")
    assert after.online and not after.stale and proc.poll() is None
