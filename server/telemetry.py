"""The gateway's telemetry for one run: broker (embedded or external) plus the registry feed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from edgesched.broker import EmbeddedBroker
from edgesched.config import TelemetrySettings
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.mqtt import BrokerURL, RegistryListener

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
