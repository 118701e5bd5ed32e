"""The gateway tells its operator what the registry refused: a log line when it changes, totals at the end."""

from __future__ import annotations

import logging

from edgesched.core.registry import DeviceRegistry
from edgesched.server.telemetry import DropReport

from ..core.heartbeats import NOW, hb_topic, heartbeat


class Listener:
    def __init__(self) -> None:
        self.registry = DeviceRegistry()

    def snapshot(self):
        return self.registry.snapshot(NOW)


def test_drops_are_logged_when_they_change_and_totalled_for_the_summary(caplog):
    listener = Listener()
    report = DropReport(listener)
    listener.registry.ingest(hb_topic("pi-1"), heartbeat("pi-1").to_json(), NOW)
    with caplog.at_level(logging.WARNING, logger="edgesched.server.telemetry"):
        report.after_round(1)  # nothing dropped: nothing to say
        for _ in range(3):
            listener.registry.ingest(hb_topic("pi-1"), b"junk", NOW)
        report.after_round(2)
        report.after_round(3)  # unchanged: said once
    assert [r.getMessage() for r in caplog.records] == ["round 2: telemetry messages accepted 1, dropped not_json 3"]
    assert report.totals() == {"telemetry_accepted": 1, "telemetry_dropped": {"not_json": 3}}
    assert DropReport(None).totals() == {}
