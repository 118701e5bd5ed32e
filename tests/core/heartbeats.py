"""Helpers that build valid wire messages for tests."""

from __future__ import annotations

from dataclasses import asdict

from edgesched.core.telemetry import Heartbeat, Status, topic

NOW = 1_800_000_000.0


def heartbeat(device_id: str = "pi-1", seq: int = 1, session: int = 1, sent_at: float = NOW, **extra) -> Heartbeat:
    values = dict(device_id=device_id, session=session, seq=seq, sent_at=sent_at, cpu_percent=12.5, load1=0.4,
                  mem_available_mb=900.0, mem_total_mb=3800.0, temp_c=51.2, throttled=False, net_type="wifi")
    return Heartbeat(**{**values, **extra})


def heartbeat_dict(**kw) -> dict:
    return asdict(heartbeat(**kw))


def hb_topic(device_id: str = "pi-1", fleet: str = "default") -> str:
    return topic(fleet, device_id, "heartbeat")


def status(device_id: str, state: str, session: int = 1) -> tuple[str, bytes]:
    return topic("default", device_id, "status"), Status(device_id, state, session).to_json()
