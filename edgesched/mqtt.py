"""MQTT transport (paho-mqtt): broker URLs, client set-up, and the gateway's registry feed.

This is the adapter between the broker and the pure `DeviceRegistry`: paho's network thread
delivers messages, the listener stamps them with the wall clock and ingests them under a
lock, and the scheduler reads immutable snapshots from any thread.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgesched.core.registry import DeviceRegistry, RegistrySnapshot
from edgesched.core.telemetry import Heartbeat, subscription
from edgesched.errors import ConfigError, EdgeschedError

log = logging.getLogger(__name__)
PASSWORD_ENV = "EDGESCHED_MQTT_PASSWORD"
PLACEHOLDER_PASSWORD = "change-me"  # what deploy/gateway/gateway.env ships with


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class BrokerURL:
    """`mqtt://[user[:password]@]host[:port]` or `mqtts://...` (TLS; default ports 1883 / 8883)."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str, username: str | None = None, password: str | None = None) -> BrokerURL:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"broker URL {url!r}: {exc}") from None
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"broker URL {url!r}: expected mqtt://host[:port] or mqtts://host[:port]")
        tls = parts.scheme == "mqtts"
        return cls(
            host=parts.hostname,
            port=port or (8883 if tls else 1883),
            tls=tls,
            username=username or (unquote(parts.username) if parts.username else None),
            password=password or (unquote(parts.password) if parts.password else None) or os.environ.get(PASSWORD_ENV),
        )

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def make_client(
    url: BrokerURL,
    client_id: str,
    *,
    ca_file: str | None = None,
    will: tuple[str, bytes] | None = None,
    keepalive: int = 30,
) -> tuple[mqtt.Client, int]:
    """A paho client set up for `url` (auth, TLS, Last Will, reconnect backoff); not yet connected.

    Returns the client and the keepalive to pass to `connect`/`connect_async`.
    """
    if url.password == PLACEHOLDER_PASSWORD:
        raise ConfigError(f"the broker password is still the shipped placeholder {PLACEHOLDER_PASSWORD!r}: set "
                          f"{PASSWORD_ENV} (gateway.env) from the password make-certs.sh wrote")
    if url.password and not url.tls and not _loopback(url.host):
        log.warning("the broker password for %s goes over plain mqtt:// to %s, readable by anyone on the way; "
                    "use mqtts://", url.username, url.host)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
    if url.username:
        client.username_pw_set(url.username, url.password)
    if url.tls:
        if ca_file and not os.path.isfile(ca_file):
            raise ConfigError(f"CA file {ca_file} does not exist")
        client.tls_set(ca_certs=ca_file)
    if will:
        client.will_set(will[0], will[1], qos=1, retain=True)
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    return client, keepalive


class RegistryListener:
    """Subscribes to a fleet's topics and feeds a `DeviceRegistry`; use as a context manager."""

    def __init__(
        self,
        registry: DeviceRegistry,
        url: BrokerURL,
        *,
        ca_file: str | None = None,
        client_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.url = url
        self._clock = clock
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self.connections = 0
        fleet = registry.config.fleet
        self._client, self._keepalive = make_client(url, client_id or f"edgesched-gateway-{fleet}-{os.getpid()}",
                                                    ca_file=ca_file)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe

    def __enter__(self) -> RegistryListener:
        try:
            self._client.connect_async(self.url.host, self.url.port, self._keepalive)
        except (OSError, ValueError) as exc:
            raise EdgeschedError(f"cannot reach the MQTT broker at {self.url}: {exc}") from exc
        self._client.loop_start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def wait_connected(self, timeout: float) -> None:
        """Block until subscribed (not merely connected), so no message after this is missed."""
        if not self._connected.wait(timeout):
            raise EdgeschedError(f"no connection to the MQTT broker at {self.url} within {timeout:.0f} s")

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def snapshot(self) -> RegistrySnapshot:
        with self._lock:
            return self.registry.snapshot(self._clock())

    def history(self, device_id: str) -> tuple[Heartbeat, ...]:
        with self._lock:
            return self.registry.history(device_id)

    def link_node(self, device_id: str, node_id: int) -> None:
        with self._lock:
            self.registry.link_node(device_id, node_id)

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        if getattr(reason, "is_failure", False):
            return
        # QoS 0: a lost heartbeat is replaced by the next; status and capabilities are retained.
        client.subscribe(subscription(self.registry.config.fleet), qos=0)
        self.connections += 1

    def _on_subscribe(self, client: mqtt.Client, userdata: object, mid: int, reasons: list, props: object) -> None:
        if not any(getattr(r, "is_failure", False) for r in reasons):
            self._connected.set()  # receiving from now on: only after the broker acknowledged
            with self._lock:
                self.registry.regained_sight(self._clock())

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason: object,
                       props: object) -> None:
        self._connected.clear()
        with self._lock:
            self.registry.lost_sight(self._clock())

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.registry.ingest(message.topic, message.payload, self._clock())
