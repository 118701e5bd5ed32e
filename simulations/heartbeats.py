"""Virtual devices' telemetry: the same messages a board's agent sends, into the same registry.

Each virtual device publishes what its agent would: "online" status and capabilities when its
agent (re)starts, a heartbeat every `heartbeat_s` while online (load, memory, temperature,
throttling, battery, link, its last job's speed), and its Last Will ("offline") when it drops
out mid-job. Silence while it is simply away: the registry times it out, as on a gateway.

Transport is one of two buses with one interface: in-process (the default: a list) or a real
MQTT broker (`--broker`). Over MQTT, `sync()` waits until the broker has delivered everything
published so far, then hands the messages to the registry stamped with the virtual time they
were sent: a seed gives the same registry, hence the same decisions, over either bus.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any, Protocol

import paho.mqtt.client as mqtt

from edgesched.core.fleet import DeviceView, device_view
from edgesched.core.registry import DeviceRegistry
from edgesched.core.telemetry import Capabilities, Heartbeat, Status, subscription, topic
from edgesched.errors import EdgeschedError
from edgesched.mqtt import BrokerURL, make_client
from edgesched.simulations.devices import VirtualDevice, VirtualFleet

NET_TYPES = {"ethernet": "ethernet", "wifi": "wifi", "mobile": "cellular"}
DELIVERY_TIMEOUT_S = 30.0


class Bus(Protocol):
    def publish(self, topic: str, payload: bytes) -> None: ...

    def drain(self) -> list[tuple[str, bytes]]:
        """Everything published since the last drain, in publishing order."""

    def close(self) -> None: ...


class InProcessBus:
    def __init__(self) -> None:
        self._queue: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes) -> None:
        self._queue.append((topic, payload))

    def drain(self) -> list[tuple[str, bytes]]:
        out, self._queue = self._queue, []
        return out

    def close(self) -> None:
        pass


class MqttBus:
    """Publishes through a broker (QoS 1, one connection, so order is kept) and reads it back."""

    def __init__(self, url: str, fleet: str) -> None:
        broker = BrokerURL.parse(url)
        self._received: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._published = 0
        tag = f"{fleet}-{os.getpid()}"
        self._sub, keepalive = make_client(broker, f"edgesched-sim-registry-{tag}")
        self._sub.on_connect = lambda c, *_: c.subscribe(subscription(fleet), qos=1)
        self._sub.on_subscribe = lambda *_: self._subscribed.set()
        self._sub.on_message = self._on_message
        self._pub, _ = make_client(broker, f"edgesched-sim-devices-{tag}")
        self._pub.max_inflight_messages_set(1000)
        try:
            for client in (self._sub, self._pub):
                client.connect(broker.host, broker.port, keepalive)
                client.loop_start()
        except OSError as exc:
            raise EdgeschedError(f"cannot reach the MQTT broker at {broker}: {exc}") from None
        if not self._subscribed.wait(DELIVERY_TIMEOUT_S):
            raise EdgeschedError(f"no subscription on the MQTT broker at {broker} within {DELIVERY_TIMEOUT_S:.0f} s")

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self._received.append((message.topic, message.payload))

    def publish(self, topic: str, payload: bytes) -> None:
        self._pub.publish(topic, payload, qos=1)
        self._published += 1

    def drain(self) -> list[tuple[str, bytes]]:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while True:
            with self._lock:
                if len(self._received) >= self._published:
                    out, self._received = self._received, []
                    self._published -= len(out)
                    return out
            if time.monotonic() > deadline:
                raise EdgeschedError(f"the MQTT broker delivered {len(self._received)} of {self._published} "
                                     f"messages within {DELIVERY_TIMEOUT_S:.0f} s")
            time.sleep(0.001)

    def close(self) -> None:
        for client in (self._pub, self._sub):
            client.disconnect()
            client.loop_stop()


class VirtualTelemetry:
    """Builds each device's messages from its simulated state and feeds the registry in order."""

    def __init__(self, fleet: VirtualFleet, registry: DeviceRegistry, bus: Bus) -> None:
        self.fleet = fleet
        self.registry = registry
        self.bus = bus
        self.name = registry.config.fleet
        self._sent: deque[tuple[float, str]] = deque()  # (virtual time, topic) of each message on the bus
        self._announced: dict[int, int] = {}  # device index -> session it has announced
        self._seq: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """For a checkpoint: everything but the bus, which a resumed run opens anew (`sync` first)."""
        if self._sent:
            raise EdgeschedError("telemetry still on the bus cannot be checkpointed; sync() first")
        return {**self.__dict__, "bus": None}

    def heartbeat(self, device: VirtualDevice, now: float) -> bool:
        """The device's heartbeat tick: announce a new session if needed, then beat. False if down."""
        if not device.is_up(now, self.fleet.dyn):
            return False
        if self._announced.get(device.index) != device.session:
            self._announced[device.index] = device.session
            self._seq[device.index] = 0
            self._publish(now, device, "status", Status(device.device_id, "online", device.session))
            self._publish(now, device, "capabilities", Capabilities(
                device.device_id, device.board.name, 4, device.board.ram_mb, "virtual", "virtual"))
        self._seq[device.index] += 1
        self._publish(now, device, "heartbeat", self._reading(device, now))
        return True

    def last_will(self, device: VirtualDevice, now: float, session: int) -> None:
        """The broker's Last Will for a device whose agent died mid-job."""
        self._publish(now, device, "status", Status(device.device_id, "offline", session))

    def sync(self) -> None:
        """Deliver everything sent so far to the registry, each at the time it was sent."""
        for received, payload in self.bus.drain():
            sent_at, sent_topic = self._sent.popleft()
            if received != sent_topic:
                raise EdgeschedError(f"the broker reordered telemetry: got {received}, expected {sent_topic}")
            self.registry.ingest(received, payload, sent_at)

    def _publish(self, now: float, device: VirtualDevice, kind: str,
                 message: Heartbeat | Status | Capabilities) -> None:
        name = topic(self.name, device.device_id, kind)
        self._sent.append((now, name))
        self.bus.publish(name, message.to_json())

    def _reading(self, device: VirtualDevice, now: float) -> Heartbeat:
        dyn = self.fleet.dyn
        load = device.background(now, dyn)
        busy = 100.0 * load / (1.0 + load)  # other work's share: an agent leaves out edgesched's own jobs
        thermal = device.thermal
        throttled = device.throttled(now)
        freq = None
        if thermal is not None:
            freq = thermal.throttled_freq_mhz if throttled else thermal.max_freq_mhz
        temp = device.temperature(now)
        speed, seconds = device.last_job or (None, None)
        return Heartbeat(
            device_id=device.device_id, session=device.session, seq=self._seq[device.index], sent_at=now,
            cpu_percent=busy, load1=4 * busy / 100.0, mem_available_mb=0.6 * device.board.ram_mb,
            mem_total_mb=device.board.ram_mb, cpu_freq_mhz=freq,
            temp_c=None if temp is None else round(temp, 2), throttled=throttled if thermal else None,
            battery_percent=None if device.power is None else round(device.charge(now, dyn), 3),
            charging=None if device.power is None else device.plugged,
            net_type=NET_TYPES.get(device.network.name, "unknown"), rtt_ms=2000.0 * device.network.latency_s,
            train_samples_per_s=speed, last_job_s=seconds,
        )


class RegistryFleetView:
    """What edgesched's loop sees of a virtual fleet: the registry, fed by the devices' telemetry.

    Devices are planned under their own ids; device i is Flower node i + 1 and trains partition i.
    """

    def __init__(self, telemetry: VirtualTelemetry, partition_sizes: list[int]) -> None:
        self._telemetry = telemetry
        self._registry = telemetry.registry
        self._index = telemetry.fleet.index
        self._sizes = partition_sizes

    def views(self, now: float) -> list[DeviceView]:
        self._telemetry.sync()
        online = sorted(self._registry.snapshot(now).online(), key=lambda s: s.device_id)
        return [device_view(s, self._sizes[self._index[s.device_id]], self._registry.history(s.device_id))
                for s in online]

    def target(self, device: str) -> tuple[int, int]:
        index = self._index[device]
        return index + 1, index

    def seen(self, node: int, device_id: str) -> None:
        """Virtual devices are known by id from the start: nothing to join."""

    def size(self) -> int:
        return len(self._sizes)

    def session(self, device: str, now: float) -> int | None:
        self._telemetry.sync()
        state = self._registry.state(device, now)
        if state is None or not state.online:
            return None
        return state.heartbeat.session if state.heartbeat else 0
