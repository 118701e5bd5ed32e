"""Hostile input: >= 10,000 malformed payloads; the registry never raises and counts each."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.core.telemetry import Heartbeat

from .heartbeats import NOW, hb_topic, heartbeat, heartbeat_dict

FIELDS = list(Heartbeat.RULES)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=5)
                           | st.dictionaries(st.text(max_size=10), kids, max_size=5), max_leaves=20)
hostile_numbers = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 2**64, -(2**63), 10**30])
topics = st.sampled_from([hb_topic("pi-1"), hb_topic("pi-2"), "edgesched/v1/default/pi-1", "#", "",
                          "edgesched/v1/default/../heartbeat", "edgesched/v1/other/pi-1/heartbeat",
                          "edgesched/v1/default/pi-1/status", "edgesched/v1/default/pi-1/capabilities"])


def _mutated(field: str, value: object) -> bytes:
    body = heartbeat_dict()
    body[field] = value
    return json.dumps(body, allow_nan=True).encode()


payloads = st.one_of(
    st.binary(max_size=600),  # garbage bytes
    json_values.map(lambda v: json.dumps(v).encode()),  # valid JSON, wrong shape
    st.builds(_mutated, st.sampled_from(FIELDS), json_values | hostile_numbers),  # one field wrong
    st.integers(1, 400).map(lambda n: heartbeat().to_json()[:n]),  # truncated
    st.integers(4097, 20000).map(lambda n: b"{" + b" " * n + b"}"),  # oversized
    st.integers(0, 3).map(lambda seq: heartbeat(seq=seq).to_json()),  # replays
    st.text(max_size=300).map(str.encode),
)

PER_EXAMPLE = 50
seen = {"payloads": 0}


@settings(max_examples=220, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(topics, payloads), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_registry_survives_hostile_payloads(batch):
    reg = DeviceRegistry(RegistryConfig(burst=1e9, rate_per_second=1e9))
    reg.ingest(hb_topic("pi-1"), heartbeat(seq=5).to_json(), NOW)  # so replays have something to replay
    for topic_name, payload in batch:
        reason = reg.ingest(topic_name, payload, NOW)  # must never raise
        assert reason is None or reg.dropped[reason] > 0
    assert reg.accepted + sum(reg.dropped.values()) == len(batch) + 1
    seen["payloads"] += len(batch)


def test_fuzz_threw_at_least_ten_thousand_payloads():
    assert seen["payloads"] >= 10_000, seen
