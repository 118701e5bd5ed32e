"""The gateway's telemetry for one run: broker (embedded or external) plus the registry feed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from edgesched.broker import EmbeddedBroker
from edgesched.config import TelemetrySettings
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.mqtt import BrokerURL, RegistryListener

log = logging.getLogger(__name__)
EMBEDDED, NONE = "embedded", "none"
EMBEDDED_PORT = 1883
CONNECT_TIMEOUT = 15.0


@contextmanager
def open_telemetry(cfg: TelemetrySettings) -> Iterator[RegistryListener | None]:
    """Yield a connected listener for `cfg.broker`, or None when the run has no telemetry.

    An mqtts:// broker is checked against `broker-ca-file`; the user name comes in the URL
    (mqtts://gateway@host:8883), the password from EDGESCHED_MQTT_PASSWORD."""
    if cfg.broker == NONE:
        yield None
        return
    with ExitStack() as stack:
        url = cfg.broker
        if url == EMBEDDED:
            url = stack.enter_context(EmbeddedBroker(port=EMBEDDED_PORT)).url
        registry = DeviceRegistry(RegistryConfig(fleet=cfg.fleet, heartbeat_interval=cfg.heartbeat_interval))
        listener = stack.enter_context(RegistryListener(registry, BrokerURL.parse(url), ca_file=cfg.broker_ca_file))
        listener.wait_connected(CONNECT_TIMEOUT)
        yield listener


class DropReport:
    """What the registry refused, for the operator: a log line after each round in which the
    counts changed (forged, malformed, replayed or flooding messages show up here first), and
    the totals for the run directory's summary.json."""

    def __init__(self, listener: RegistryListener | None) -> None:
        self.listener = listener
        self._logged: dict[str, int] = {}

    def after_round(self, rnd: int) -> None:
        if self.listener is None:
            return
        snapshot = self.listener.snapshot()
        dropped = dict(snapshot.dropped)
        if dropped != self._logged:
            log.warning("round %d: telemetry messages accepted %d, dropped %s", rnd, snapshot.accepted,
                        ", ".join(f"{reason} {n}" for reason, n in sorted(dropped.items())))
            self._logged = dropped

    def totals(self) -> dict[str, Any]:
        if self.listener is None:
            return {}
        snapshot = self.listener.snapshot()
        return {"telemetry_accepted": snapshot.accepted, "telemetry_dropped": dict(sorted(snapshot.dropped.items()))}
