"""The device agent: publishes resource heartbeats over MQTT (no torch, no Flower).

Lifecycle, as docs/protocol.md specifies:
- Connects with a Last Will `offline` (retained) on its status topic, so a board that dies or
  loses its link is marked offline by the broker within 1.5 x keepalive.
- On every (re)connect: retained `online` status and capabilities, then the newest heartbeat.
- Every interval: reads its probes and publishes a heartbeat. While disconnected it keeps only
  the newest heartbeat (old readings are worthless to a scheduler) and paho reconnects with
  backoff (1 s doubling to 30 s).
- SIGTERM or SIGINT: publishes `offline`, disconnects, exits 0.
The heartbeat's `rtt_ms` is the previous heartbeat's publish-to-acknowledge time (QoS 1):
the round trip to the gateway's broker, measured with the traffic the agent sends anyway.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

from edgesched.clients import probes
from edgesched.clients.job_report import TrainingWatch, read_job_report
from edgesched.core.telemetry import Capabilities, Heartbeat, Status, TelemetryError, topic
from edgesched.mqtt import BrokerURL, make_client

log = logging.getLogger("edgesched.agent")


@dataclass(frozen=True)
class AgentConfig:
    broker: BrokerURL
    device_id: str
    fleet: str = "default"
    interval: float = 5.0
    keepalive: int = 30
    ca_file: str | None = None
    cgroup: str | None = None  # report the load of this cgroup (probes.CgroupCpu), not the machine's


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        read_resources: Callable[[], dict[str, object]] = probes.read_resources,
        clock: Callable[[], float] = time.time,
        speed_test: dict[str, object] | None = None,
    ) -> None:
        self.config = config
        self._read_resources = read_resources
        self._clock = clock
        self.session = int(clock() * 1000)
        self.seq = 0
        self._lock = threading.Lock()
        self._pending: Heartbeat | None = None
        self._inflight: dict[int, float] = {}
        self._rtt_ms: float | None = None
        self._stopping = False
        self._other_work = TrainingWatch(config.device_id)  # the load a heartbeat reports: not its own jobs'
        self._last_read = clock()
        cid = config.device_id
        self._capabilities = Capabilities(device_id=cid, **probes.capabilities(), **(speed_test or {}))
        self._status_topic = topic(config.fleet, cid, "status")
        will = Status(cid, "offline", self.session).to_json()
        self._client, _ = make_client(config.broker, f"edgesched-agent-{config.fleet}-{cid}", ca_file=config.ca_file,
                                      will=(self._status_topic, will), keepalive=config.keepalive)
        self._client.max_queued_messages_set(16)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set, then say goodbye; survives any broker outage."""
        self._client.connect_async(self.config.broker.host, self.config.broker.port, self.config.keepalive)
        self._client.loop_start()
        self._read_resources()  # warm-up: psutil's first cpu_percent reading is meaningless
        self._last_read = self._clock()
        next_beat = time.monotonic()
        try:
            while not stop.wait(max(0.0, next_beat - time.monotonic())):
                self._beat()
                next_beat += self.config.interval
        finally:
            self._goodbye()

    def _beat(self) -> None:
        self.seq += 1
        try:
            resources = self._read_resources()
            now = self._clock()
            resources["cpu_percent"] = self._other_work.report(self._last_read, now, float(resources["cpu_percent"]))
            self._last_read = now
            heartbeat = Heartbeat(
                device_id=self.config.device_id, session=self.session, seq=self.seq, sent_at=now,
                rtt_ms=self._rtt_ms, **resources, **read_job_report(self.config.device_id),
            )
        except TelemetryError as exc:  # a probe read nonsense: skip this beat, keep running
            log.warning("skipped heartbeat %d: %s", self.seq, exc)
            return
        with self._lock:
            if self._client.is_connected():
                self._publish_heartbeat(heartbeat)
            else:
                self._pending = heartbeat  # keep only the newest

    def _publish_heartbeat(self, heartbeat: Heartbeat) -> None:
        info = self._client.publish(topic(self.config.fleet, self.config.device_id, "heartbeat"),
                                    heartbeat.to_json(), qos=1)
        self._inflight = {info.mid: time.monotonic()}  # RTT of the newest only

    def _goodbye(self) -> None:
        self._stopping = True
        if self._client.is_connected():
            status = Status(self.config.device_id, "offline", self.session).to_json()
            info = self._client.publish(self._status_topic, status, qos=1, retain=True)
            with contextlib.suppress(RuntimeError, ValueError):  # lost connection: the Will says it
                info.wait_for_publish(timeout=5)
        self._client.disconnect()
        self._client.loop_stop()
        log.info("offline: published status and disconnected")

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        if getattr(reason, "is_failure", False):
            log.warning("broker %s refused the connection: %s", self.config.broker, reason)
            return
        log.info("connected to %s", self.config.broker)
        cid = self.config.device_id
        client.publish(self._status_topic, Status(cid, "online", self.session).to_json(), qos=1, retain=True)
        client.publish(topic(self.config.fleet, cid, "capabilities"), self._capabilities.to_json(), qos=1,
                       retain=True)
        with self._lock:
            if self._pending is not None:
                self._publish_heartbeat(self._pending)
                self._pending = None

    def _on_disconnect(self, client: mqtt.Client, userdata: object, flags: object, reason: object,
                       props: object) -> None:
        if not self._stopping:
            log.warning("disconnected from %s (%s); reconnecting with backoff", self.config.broker, reason)

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int, reason: object, props: object) -> None:
        sent = self._inflight.pop(mid, None)
        if sent is not None:
            self._rtt_ms = (time.monotonic() - sent) * 1000.0


def run_agent(config: AgentConfig, speed_test: str | None = None) -> None:
    """Run until SIGTERM/SIGINT; the signal only sets an event, so the goodbye always runs.

    With `speed_test` (a data set's name), first time onnxruntime on that data set's model and
    publish the speed with the capabilities: the gateway's prior for the board's first job."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    measured = None
    if speed_test is not None:
        from edgesched.export import infer_samples_per_s

        sps = infer_samples_per_s(speed_test)
        log.info("speed test: onnxruntime infers %.0f %s samples/s", sps, speed_test)
        measured = {"speedtest_model": speed_test, "speedtest_infer_sps": sps}
    read = probes.read_resources
    if config.cgroup:
        cpu = probes.CgroupCpu(Path(config.cgroup))
        read = functools.partial(probes.read_resources, cpu.percent)
    Agent(config, read, speed_test=measured).run(stop)
