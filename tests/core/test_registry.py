import json

import pytest

from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.core.telemetry import Heartbeat, TelemetryError

from .heartbeats import NOW, hb_topic, heartbeat, heartbeat_dict, status


def _ingest(reg: DeviceRegistry, payload: dict | bytes, topic_name: str | None = None, now: float = NOW):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return reg.ingest(topic_name or hb_topic(payload.get("device_id", "pi-1") if isinstance(payload, dict) else "pi-1"),
                      data, now)


def test_wire_format_round_trips_and_is_compact():
    hb = heartbeat(battery_percent=80.0, charging=True, rtt_ms=3.2, train_samples_per_s=410.0)
    raw = hb.to_json()
    assert Heartbeat.from_json(raw) == hb
    assert b" " not in raw and len(raw) < 500


def test_accepted_heartbeat_makes_the_device_online():
    reg = DeviceRegistry()
    assert _ingest(reg, heartbeat_dict()) is None
    device = reg.snapshot(NOW).devices["pi-1"]
    assert device.online and device.heartbeat.temp_c == 51.2


def test_a_node_linked_before_its_device_is_heard_keeps_the_link():
    reg = DeviceRegistry()
    reg.link_node("pi-1", 7)  # the SuperNode answered before its agent's first heartbeat
    assert _ingest(reg, heartbeat_dict()) is None
    assert reg.snapshot(NOW).devices["pi-1"].node_id == 7


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cpu_percent": 101}, "out_of_range"),
        ({"cpu_percent": "12"}, "bad_type"),
        ({"seq": 2.0}, "bad_type"),
        ({"throttled": 1}, "bad_type"),
        ({"load1": True}, "bad_type"),
        ({"temp_c": 1e300}, "out_of_range"),
        ({"mem_available_mb": 5000.0}, "out_of_range"),
        ({"net_type": "carrier-pigeon"}, "out_of_range"),
        ({"v": 2}, "bad_version"),
        ({"extra": 1}, "bad_schema"),
        ({"sent_at": NOW + 120}, "clock_skew"),
    ],
)
def test_each_rule_refuses_and_counts(change, reason):
    reg = DeviceRegistry()
    assert _ingest(reg, {**heartbeat_dict(), **change}) == reason
    assert reg.dropped[reason] == 1 and reg.accepted == 0


def test_missing_field_nan_truncated_and_oversized_are_refused():
    reg = DeviceRegistry()
    body = heartbeat_dict()
    del body["load1"]
    assert _ingest(reg, body) == "bad_schema"
    assert _ingest(reg, heartbeat().to_json().replace(b'"load1":0.4', b'"load1":NaN')) == "out_of_range"
    assert _ingest(reg, heartbeat().to_json()[:-5]) == "not_json"
    assert _ingest(reg, b" " * 5000) == "oversized"
    assert reg.accepted == 0 and sum(reg.dropped.values()) == 4


def test_topic_must_name_the_same_device_as_the_payload():
    reg = DeviceRegistry()
    assert _ingest(reg, heartbeat_dict(device_id="pi-2"), hb_topic("pi-1")) == "id_mismatch"
    assert "pi-1" not in reg.snapshot(NOW).devices


@pytest.mark.parametrize("name", ["edgesched/v1/default/pi-1", "edgesched/v2/default/pi-1/heartbeat",
                                  "edgesched/v1/default/pi 1/heartbeat", "edgesched/v1/default/pi-1/reboot"])
def test_bad_topics_are_refused(name):
    assert DeviceRegistry().ingest(name, heartbeat().to_json(), NOW) == "bad_topic"


def test_other_fleets_are_ignored():
    reg = DeviceRegistry(RegistryConfig(fleet="lab"))
    assert reg.ingest(hb_topic(fleet="campus"), heartbeat().to_json(), NOW) == "other_fleet"


def test_sequence_must_increase_within_a_session_and_a_new_session_resets_it():
    reg = DeviceRegistry()
    assert _ingest(reg, heartbeat_dict(seq=5)) is None
    assert _ingest(reg, heartbeat_dict(seq=5)) == "replayed"
    assert _ingest(reg, heartbeat_dict(seq=3)) == "replayed"
    assert _ingest(reg, heartbeat_dict(seq=1, session=2)) is None  # the agent restarted
    assert _ingest(reg, heartbeat_dict(seq=9, session=1)) == "replayed"  # the old session is over


def test_rate_limit_allows_a_burst_then_the_sustained_rate():
    reg = DeviceRegistry(RegistryConfig(rate_per_second=1.0, burst=3))
    results = [_ingest(reg, heartbeat_dict(seq=i), now=NOW) for i in range(1, 6)]
    assert results == [None, None, None, "rate_limited", "rate_limited"]
    assert _ingest(reg, heartbeat_dict(seq=6, sent_at=NOW + 1), now=NOW + 1.0) is None


def test_offline_status_is_immediate_and_timeout_follows_silence():
    cfg = RegistryConfig(heartbeat_interval=2.0, timeout_intervals=2.5)
    reg = DeviceRegistry(cfg)
    _ingest(reg, heartbeat_dict(device_id="a"), hb_topic("a"))
    _ingest(reg, heartbeat_dict(device_id="b"), hb_topic("b"))
    reg.ingest(*status("a", "offline"), NOW + 1)
    snap = reg.snapshot(NOW + 1)
    assert (snap.devices["a"].online, snap.devices["a"].offline_reason) == (False, "status")
    assert snap.devices["b"].online
    later = reg.snapshot(NOW + 5.01)
    assert (later.devices["b"].online, later.devices["b"].offline_reason) == (False, "timeout")
    # dated by when the gateway could tell, not by when it looked
    much_later = reg.snapshot(NOW + 60).devices
    assert (much_later["a"].offline_since, much_later["b"].offline_since) == (NOW + 1, NOW + 5)
    assert snap.devices["b"].offline_since is None


def test_a_last_will_from_an_older_session_does_not_take_down_the_new_one():
    reg = DeviceRegistry()
    _ingest(reg, heartbeat_dict(session=2))
    assert reg.ingest(*status("pi-1", "offline", session=1), NOW) == "stale_status"
    assert reg.snapshot(NOW).devices["pi-1"].online


def test_new_session_heartbeat_brings_an_offline_device_back():
    reg = DeviceRegistry()
    reg.ingest(*status("pi-1", "offline", session=1), NOW)
    assert not reg.snapshot(NOW).devices["pi-1"].online
    _ingest(reg, heartbeat_dict(session=2))
    assert reg.snapshot(NOW).devices["pi-1"].online


def test_history_is_bounded_and_snapshot_is_immutable():
    reg = DeviceRegistry(RegistryConfig(history=3, burst=100))
    for seq in range(1, 8):
        _ingest(reg, heartbeat_dict(seq=seq))
    assert [hb.seq for hb in reg.history("pi-1")] == [5, 6, 7]
    snap = reg.snapshot(NOW)
    with pytest.raises(TypeError):
        snap.devices["x"] = None  # type: ignore[index]
    _ingest(reg, heartbeat_dict(seq=8))
    assert snap.devices["pi-1"].heartbeat.seq == 7  # taken before; unchanged


def test_link_node_joins_flower_and_mqtt_ids():
    reg = DeviceRegistry()
    _ingest(reg, heartbeat_dict())
    reg.link_node("pi-1", 424242)
    reg.link_node("unknown", 1)
    assert reg.snapshot(NOW).devices["pi-1"].node_id == 424242
    assert "unknown" not in reg.snapshot(NOW).devices


def test_device_count_is_capped():
    reg = DeviceRegistry(RegistryConfig(max_devices=2))
    for name in ("a", "b", "c"):
        _ingest(reg, heartbeat_dict(device_id=name), hb_topic(name))
    assert reg.dropped["too_many_devices"] == 1 and len(reg.snapshot(NOW).devices) == 2


def test_telemetry_error_carries_its_reason():
    with pytest.raises(TelemetryError) as info:
        heartbeat(cpu_percent=-1)
    assert info.value.reason == "out_of_range"


def test_while_the_broker_is_out_of_reach_devices_stay_on_their_last_known_state():
    reg = DeviceRegistry(RegistryConfig(heartbeat_interval=5.0))  # timeout 12.5 s
    reg.ingest(hb_topic("alive"), heartbeat("alive", sent_at=98.0).to_json(), 98.0)
    reg.ingest(hb_topic("gone"), heartbeat("gone", sent_at=50.0).to_json(), 50.0)
    reg.lost_sight(100.0)
    during = reg.snapshot(108.0 + 20)  # long past the timeout, still out of reach
    assert during.devices["alive"].online and during.devices["alive"].stale
    assert not during.devices["gone"].online  # it had timed out before the outage
    reg.regained_sight(130.0)
    assert reg.snapshot(140.0).devices["alive"].online  # a fresh timeout to be heard again
    assert reg.snapshot(143.0).devices["alive"].offline_reason == "timeout"
    timed_out = reg.snapshot(160.0).devices
    assert timed_out["alive"].offline_since == 130.0 + 12.5  # its fresh timeout ran from the broker's return
    assert timed_out["gone"].offline_since == 50.0 + 12.5  # it had gone quiet before the outage
    reg.ingest(hb_topic("alive"), heartbeat("alive", seq=2, sent_at=141.0).to_json(), 141.0)
    fresh = reg.snapshot(143.0).devices["alive"]
    assert fresh.online and not fresh.stale


def test_last_wills_sent_by_a_broker_shutting_down_do_not_take_the_fleet_offline():
    reg = DeviceRegistry(RegistryConfig(heartbeat_interval=5.0))
    for device in ("a", "b"):
        reg.ingest(hb_topic(device), heartbeat(device, sent_at=98.0).to_json(), 98.0)
    reg.ingest(*status("a", "offline"), 99.5)  # the broker's shutdown: wills, then the link drops
    reg.ingest(*status("b", "offline"), 95.0)  # b died for real, well before
    reg.lost_sight(100.0)
    devices = reg.snapshot(105.0).devices
    assert devices["a"].online and not devices["b"].online


def test_a_forged_far_future_session_is_refused_and_cannot_make_a_device_sticky():
    reg = DeviceRegistry()
    real = int(NOW * 1000)  # an agent's session: its start time in ms
    _ingest(reg, heartbeat_dict(session=real, seq=1))
    assert reg.ingest(*status("pi-1", "offline", session=2**53), NOW) == "future_session"
    assert _ingest(reg, heartbeat_dict(session=2**53, seq=1)) == "future_session"
    assert _ingest(reg, heartbeat_dict(session=real, seq=2)) is None  # the real agent is still heard
    assert reg.snapshot(NOW).devices["pi-1"].online


def test_an_agent_whose_clock_was_set_back_is_heard_again_once_its_clock_is_right():
    cfg = RegistryConfig(heartbeat_interval=2.0, timeout_intervals=2.5)  # timeout 5 s
    reg = DeviceRegistry(cfg)
    year = 365 * 86400
    _ingest(reg, heartbeat_dict(session=int(NOW * 1000), seq=1))
    reg.ingest(*status("pi-1", "offline", session=int(NOW * 1000)), NOW + 1)  # a clean exit
    # Restarted with its clock a year behind: its session is a year old, its beats are refused...
    behind = int((NOW - year) * 1000)
    assert _ingest(reg, heartbeat_dict(session=behind, seq=1, sent_at=NOW - year + 2), now=NOW + 2) == "clock_skew"
    # ... until NTP corrects its clock; the old session's beats then count, its status too.
    assert _ingest(reg, heartbeat_dict(session=behind, seq=2, sent_at=NOW + 10), now=NOW + 10) is None
    assert reg.snapshot(NOW + 10).devices["pi-1"].online
    # Replays are refused as before: within the session that took over, as in any other.
    assert _ingest(reg, heartbeat_dict(session=behind, seq=2, sent_at=NOW + 12), now=NOW + 12) == "replayed"
    assert _ingest(reg, heartbeat_dict(session=behind, seq=3, sent_at=NOW + 12), now=NOW + 12) is None


def test_junk_under_a_device_id_does_not_spend_that_devices_rate_allowance():
    reg = DeviceRegistry(RegistryConfig(rate_per_second=1.0, burst=3))
    for _ in range(50):
        assert reg.ingest(hb_topic(), b"{not json", NOW) == "not_json"
    assert _ingest(reg, heartbeat_dict(seq=1)) is None
