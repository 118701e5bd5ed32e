"""The gateway's live view of the fleet, fed by heartbeat, status and capability messages.

Pure logic: `ingest(topic, payload, now)` and `snapshot(now)` take time as an input and
never block, so the MQTT adapter, the simulator and the tests drive the same code. Every
refused message is dropped and counted under a reason; nothing a device sends can raise.

Liveness: a device is online after a retained "online" status or a heartbeat, and offline at
once on an "offline" status (clean exit or the broker's Last Will), or when no heartbeat came
for `timeout_intervals` heartbeat intervals. Silence is the device's fault only while the
gateway can hear: while its broker connection is down (`lost_sight` .. `regained_sight`) no
device times out — those alive when the outage began stay online on their last-known state,
marked `stale` — and after it each gets a fresh timeout to be heard again. A broker that is
shut down sends every connected device's Last Will first; an "offline" status that arrived in
the `shutdown_window_s` before the gateway lost the broker is taken for that, not for the
device's death, and the device is judged by its heartbeats instead.

Sessions: a session is its agent's start time in ms, and within one the sequence numbers rise.
A heartbeat must be sent within `max_clock_skew` of the gateway's clock, its (session, seq)
above the newest heard, and a status's session no older than the newest: replays and a dead
session's late Last Will are refused. No session may start after the gateway's now (plus the
skew): a forged far-future session would otherwise outrank every real one for good. An older
session may take over once the newest has been silent for the timeout: an agent that started
while its clock was set back, and whose clock was then corrected, is heard again; a replay
still is not, its send time being old.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from edgesched.core.telemetry import Capabilities, Heartbeat, Status, TelemetryError, parse_topic

MESSAGES: dict[str, type[Heartbeat] | type[Status] | type[Capabilities]] = {
    "heartbeat": Heartbeat, "status": Status, "capabilities": Capabilities}


@dataclass(frozen=True)
class RegistryConfig:
    fleet: str = "default"
    heartbeat_interval: float = 5.0
    timeout_intervals: float = 2.5
    max_clock_skew: float = 30.0
    rate_per_second: float = 2.0  # sustained messages per device
    burst: float = 10.0  # messages a device may send at once (a reconnect sends three)
    history: int = 120  # heartbeats kept per device
    max_devices: int = 100_000
    shutdown_window_s: float = 2.0  # Last Wills this soon before losing the broker are its shutdown's

    def __post_init__(self) -> None:
        if self.heartbeat_interval <= 0 or self.timeout_intervals < 1:
            raise ValueError("heartbeat_interval must be > 0 and timeout_intervals >= 1")

    @property
    def timeout(self) -> float:
        return self.heartbeat_interval * self.timeout_intervals


@dataclass(frozen=True)
class DeviceState:
    """One device as the scheduler sees it at snapshot time."""

    device_id: str
    online: bool
    last_seen: float | None
    heartbeat: Heartbeat | None
    capabilities: Capabilities | None
    node_id: int | None
    offline_reason: str | None  # "status", "timeout" or None while online
    stale: bool = False  # online on its last-known state: nothing heard for longer than the timeout
    # When the gateway could first tell it was gone (its offline status in, or its silence past
    # the timeout), not when someone looked: a trace dates its leaving by this.
    offline_since: float | None = None


@dataclass(frozen=True)
class RegistrySnapshot:
    """An immutable view: safe to hand to the planner while ingestion goes on."""

    taken_at: float
    devices: Mapping[str, DeviceState]
    dropped: Mapping[str, int]
    accepted: int

    def online(self) -> list[DeviceState]:
        return [d for d in self.devices.values() if d.online]


@dataclass
class _Device:
    status: Status | None = None
    status_at: float | None = None
    capabilities: Capabilities | None = None
    last_seen: float | None = None
    last_key: tuple[int, int] = (-1, -1)  # (session, seq) of the newest heartbeat
    tokens: float = 0.0
    refilled_at: float | None = None
    node_id: int | None = None
    history: deque[Heartbeat] = field(default_factory=deque)


class DeviceRegistry:
    """Validates and holds per-device state; see the module docstring for the rules."""

    def __init__(self, config: RegistryConfig | None = None) -> None:
        self.config = config or RegistryConfig()
        self.dropped: Counter[str] = Counter()
        self.accepted = 0
        self._devices: dict[str, _Device] = {}
        self._links: dict[str, int] = {}  # device id -> Flower node id, from the gateway's replies
        self._outage: tuple[float, float] | None = None  # the last span without a broker (end inf: still)

    def lost_sight(self, now: float) -> None:
        """The gateway's broker connection dropped: silence from now on is not the devices'."""
        if self._outage is None or self._outage[1] != math.inf:
            self._outage = (now, math.inf)

    def regained_sight(self, now: float) -> None:
        if self._outage is not None and self._outage[1] == math.inf:
            self._outage = (self._outage[0], now)

    def ingest(self, topic: str, payload: bytes, now: float) -> str | None:
        """Apply one message; return None if accepted, else the reason it was dropped."""
        try:
            self._apply(topic, payload, now)
        except TelemetryError as exc:
            self.dropped[exc.reason] += 1
            return exc.reason
        self.accepted += 1
        return None

    def link_node(self, device_id: str, node_id: int) -> None:
        """Join a Flower node id (from a ClientApp reply) to the device it runs on, even if the
        device has not been heard yet: its agent may start after its SuperNode."""
        self._links[device_id] = node_id
        if device_id in self._devices:
            self._devices[device_id].node_id = node_id

    def history(self, device_id: str) -> tuple[Heartbeat, ...]:
        device = self._devices.get(device_id)
        return tuple(device.history) if device else ()

    def state(self, device_id: str, now: float) -> DeviceState | None:
        """One device's state at `now` (None if it never sent anything)."""
        device = self._devices.get(device_id)
        return None if device is None else self._state(device_id, device, now)

    def snapshot(self, now: float) -> RegistrySnapshot:
        devices = {device_id: self._state(device_id, d, now) for device_id, d in self._devices.items()}
        return RegistrySnapshot(now, MappingProxyType(devices), MappingProxyType(dict(self.dropped)), self.accepted)

    def _apply(self, topic: str, payload: bytes, now: float) -> None:
        fleet, device_id, kind = parse_topic(topic)
        if fleet != self.config.fleet:
            raise TelemetryError("other_fleet", fleet)
        device = self._devices.get(device_id)
        if device is None:
            if len(self._devices) >= self.config.max_devices:
                raise TelemetryError("too_many_devices")
            device = _Device(tokens=self.config.burst, refilled_at=now, node_id=self._links.get(device_id))
        message = MESSAGES[kind].from_json(payload)
        if message.device_id != device_id:
            raise TelemetryError("id_mismatch", f"topic {device_id}, payload {message.device_id}")
        self._take_token(device, now)  # after validation: junk under a device's id spends none of its allowance
        if isinstance(message, Heartbeat):
            self._heartbeat(device, message, now)
        elif isinstance(message, Status):
            self._status(device, message, now)
            device.status_at = now
        else:
            device.capabilities = message
        self._devices[device_id] = device

    def _take_token(self, device: _Device, now: float) -> None:
        """Token bucket per device: `burst` at once, `rate_per_second` sustained."""
        elapsed = max(0.0, now - (device.refilled_at if device.refilled_at is not None else now))
        device.tokens = min(self.config.burst, device.tokens + elapsed * self.config.rate_per_second)
        device.refilled_at = now
        if device.tokens < 1:
            raise TelemetryError("rate_limited")
        device.tokens -= 1

    def _heartbeat(self, device: _Device, hb: Heartbeat, now: float) -> None:
        if abs(hb.sent_at - now) > self.config.max_clock_skew:
            raise TelemetryError("clock_skew", f"{hb.sent_at - now:+.1f} s")
        self._check_session(hb.session, now)
        key = (hb.session, hb.seq)
        takes_over = hb.session < device.last_key[0] and self._gone_quiet(device, now)
        if key <= device.last_key and not takes_over:
            raise TelemetryError("replayed", f"{key} <= {device.last_key}")
        if device.status is not None and (hb.session > device.status.session or takes_over):
            device.status = None  # a newer agent session (or one taking over) supersedes an old status
        device.last_key = key
        device.last_seen = now
        device.history.append(hb)
        while len(device.history) > self.config.history:
            device.history.popleft()

    def _status(self, device: _Device, status: Status, now: float) -> None:
        self._check_session(status.session, now)
        # A Last Will from an older session must not take down the newer one.
        current = device.status.session if device.status else device.last_key[0]
        if status.session < current and not self._gone_quiet(device, now):
            raise TelemetryError("stale_status", f"session {status.session} < {current}")
        device.status = status

    def _check_session(self, session: int, now: float) -> None:
        """A session is its agent's start time in ms: one that starts after now (beyond the
        clock skew allowed) cannot be, and would outrank every real session after it."""
        if session / 1000 > now + self.config.max_clock_skew:
            raise TelemetryError("future_session", f"session {session} starts after now ({now:.0f} s)")

    def _gone_quiet(self, device: _Device, now: float) -> bool:
        """The newest session has not been heard for longer than the timeout: an older session
        may take over (an agent restarted under a clock set back, then corrected)."""
        return device.last_seen is None or now - device.last_seen > self.config.timeout

    def _state(self, device_id: str, d: _Device, now: float) -> DeviceState:
        reason, since = None, None
        if d.status is not None and d.status.state == "offline" and not self._shutdown_will(d):
            reason, since = "status", d.status_at
        elif d.last_seen is None and d.status is None:
            reason = "never_seen"
        elif d.last_seen is not None and (silent := self._silent_s(d.last_seen, now)) > self.config.timeout:
            reason, since = "timeout", now - silent + self.config.timeout
        return DeviceState(
            device_id=device_id,
            online=reason is None,
            last_seen=d.last_seen,
            heartbeat=d.history[-1] if d.history else None,
            capabilities=d.capabilities,
            node_id=d.node_id,
            offline_reason=reason,
            offline_since=since,
            stale=reason is None and d.last_seen is not None and now - d.last_seen > self.config.timeout,
        )

    def _shutdown_will(self, d: _Device) -> bool:
        """An offline status that came just before the gateway lost the broker: the broker's shutdown."""
        return self._outage is not None and d.status_at is not None and d.last_seen is not None \
            and self._outage[0] - self.config.shutdown_window_s <= d.status_at <= self._outage[0]

    def _silent_s(self, last_seen: float, now: float) -> float:
        """Seconds of silence held against a device: none of an outage it was alive at the start of."""
        if self._outage is None or last_seen + self.config.timeout < self._outage[0]:  # none, or gone before it
            return now - last_seen
        end = self._outage[1]
        return 0.0 if now < end else now - max(last_seen, end)
