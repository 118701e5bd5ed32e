"""The heartbeat protocol: topics, versioned wire format and validation (stdlib only).

Devices publish compact JSON under `edgesched/v1/{fleet}/{device_id}/{kind}`, with kind one of
`heartbeat`, `status` (retained; "offline" is also the Last Will) and `capabilities`
(retained). JSON because every board can produce and debug it (mosquitto_sub shows it as it
is), and a heartbeat is ~400 bytes: size is not what limits a gateway; parsing and checking
each message is, and that is measured in docs/benchmarks.md.

Parsing never trusts the payload: every field is checked for type and range, unknown or
missing fields are refused, and NaN/inf never get in. A refusal is a `TelemetryError`
carrying a short machine-readable reason, which the registry counts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, asdict, dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, cast

if TYPE_CHECKING:
    from typing_extensions import Self

SCHEMA_VERSION = 1
TOPIC_ROOT = "edgesched/v1"
KINDS = ("heartbeat", "status", "capabilities")
MAX_PAYLOAD_BYTES = 4096
NET_TYPES = ("ethernet", "wifi", "cellular", "unknown")
# What a plan reads of every heartbeat (Heartbeat.readings); the link's kind comes last.
READINGS = ("cpu_percent", "cpu_freq_mhz", "throttled", "train_samples_per_s", "rtt_ms", "battery_percent",
            "charging", "mem_available_mb", "net_type")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class TelemetryError(ValueError):
    """A message that is refused; `reason` is the counter it is dropped under."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def valid_id(value: str) -> bool:
    """Fleet and device ids: 1-64 of letters, digits, `_ . -`; safe in topics and file names."""
    return bool(_ID.fullmatch(value))


def topic(fleet: str, device_id: str, kind: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{device_id}/{kind}"


def subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/+/+"


def parse_topic(name: str) -> tuple[str, str, str]:
    """Split a topic into (fleet, device id, kind), or raise `TelemetryError('bad_topic')`."""
    parts = name.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_ROOT:
        raise TelemetryError("bad_topic", name[:100])
    fleet, device_id, kind = parts[2:]
    if not (valid_id(fleet) and valid_id(device_id)) or kind not in KINDS:
        raise TelemetryError("bad_topic", name[:100])
    return fleet, device_id, kind


# Field rules: (types, low, high, optional). Numbers outside [low, high] are refused.
_Rule = tuple[tuple[type, ...], float | None, float | None, bool]
_NUM = (int, float)
_BIG = 1e12


def _rule(types: tuple[type, ...], low: float | None = None, high: float | None = None,
          optional: bool = False) -> _Rule:
    return (types, low, high, optional)


class _WireMessage:
    """Shared behaviour of the three messages: self-validation and the JSON wire format.

    Subclasses are frozen dataclasses with a `RULES` table; `_check` adds cross-field rules.
    """

    RULES: ClassVar[dict[str, _Rule]]

    def __post_init__(self) -> None:
        _check_fields(self)
        self._check()

    def _check(self) -> None:
        """Rules that involve more than one field; none by default."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(cast(Any, self)), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_json(cls, payload: bytes) -> Self:
        return cls(**_load(payload, cls))


@dataclass(frozen=True)
class Heartbeat(_WireMessage):
    """What a device can do right now. Optional readings are `None` where a board lacks them."""

    device_id: str
    session: int  # the agent's start time in ms: a restarted agent starts a newer session
    seq: int  # per session, strictly increasing
    sent_at: float  # the device's clock, Unix seconds
    cpu_percent: float
    load1: float
    mem_available_mb: float
    mem_total_mb: float
    cpu_freq_mhz: float | None = None
    temp_c: float | None = None
    throttled: bool | None = None
    throttle_flags: int | None = None
    battery_percent: float | None = None
    charging: bool | None = None
    net_type: str = "unknown"
    rtt_ms: float | None = None
    train_samples_per_s: float | None = None
    last_job_s: float | None = None
    v: int = SCHEMA_VERSION

    RULES: ClassVar[dict[str, _Rule]] = {
        "device_id": _rule((str,)),
        "session": _rule((int,), 0, 2**53),
        "seq": _rule((int,), 0, 2**53),
        "sent_at": _rule(_NUM, 0, 1e11),
        "cpu_percent": _rule(_NUM, 0, 100),
        "load1": _rule(_NUM, 0, 1e4),
        "mem_available_mb": _rule(_NUM, 0, 1e7),
        "mem_total_mb": _rule(_NUM, 0, 1e7),
        "cpu_freq_mhz": _rule(_NUM, 0, 1e5, optional=True),
        "temp_c": _rule(_NUM, -60, 150, optional=True),
        "throttled": _rule((bool,), optional=True),
        "throttle_flags": _rule((int,), 0, 2**32, optional=True),
        "battery_percent": _rule(_NUM, 0, 100, optional=True),
        "charging": _rule((bool,), optional=True),
        "net_type": _rule((str,)),
        "rtt_ms": _rule(_NUM, 0, 1e6, optional=True),
        "train_samples_per_s": _rule(_NUM, 0, _BIG, optional=True),
        "last_job_s": _rule(_NUM, 0, 1e7, optional=True),
        "v": _rule((int,), SCHEMA_VERSION, SCHEMA_VERSION),
    }

    def _check(self) -> None:
        if self.net_type not in NET_TYPES:
            raise TelemetryError("out_of_range", f"net_type {self.net_type!r}")
        if self.mem_available_mb > self.mem_total_mb:
            raise TelemetryError("out_of_range", "mem_available_mb > mem_total_mb")
        _ = self.readings  # made now, as the heartbeat arrives, not when a plan reads it

    @cached_property
    def readings(self) -> tuple[float, ...]:
        """The `READINGS` as floats (None: nan, a flag: 0 or 1, the link: its index in
        `NET_TYPES`): a plan reads every registered device's, 100,000 on a large fleet, and
        one ready row per device is what that costs least."""
        values = (getattr(self, name) for name in READINGS[:-1])
        return (*(math.nan if v is None else float(v) for v in values), float(NET_TYPES.index(self.net_type)))


@dataclass(frozen=True)
class Capabilities(_WireMessage):
    """What a device is: published retained once per connection."""

    device_id: str
    board: str
    cores: int
    ram_mb: float
    os: str
    python: str
    accelerator: str | None = None
    torch: str | None = None
    onnxruntime: str | None = None
    speedtest_model: str | None = None  # the data set whose model the agent's start-up speed test ran
    speedtest_infer_sps: float | None = None  # samples/s it inferred with onnxruntime
    v: int = SCHEMA_VERSION

    RULES: ClassVar[dict[str, _Rule]] = {
        "device_id": _rule((str,)),
        "board": _rule((str,)),
        "cores": _rule((int,), 1, 4096),
        "ram_mb": _rule(_NUM, 1, 1e7),
        "os": _rule((str,)),
        "python": _rule((str,)),
        "accelerator": _rule((str,), optional=True),
        "torch": _rule((str,), optional=True),
        "onnxruntime": _rule((str,), optional=True),
        "speedtest_model": _rule((str,), optional=True),
        "speedtest_infer_sps": _rule(_NUM, 1e-3, 1e9, optional=True),
        "v": _rule((int,), SCHEMA_VERSION, SCHEMA_VERSION),
    }



@dataclass(frozen=True)
class Status(_WireMessage):
    """"online" when an agent connects; "offline" on clean exit and as its Last Will."""

    device_id: str
    state: str
    session: int
    v: int = SCHEMA_VERSION

    RULES: ClassVar[dict[str, _Rule]] = {
        "device_id": _rule((str,)),
        "state": _rule((str,)),
        "session": _rule((int,), 0, 2**53),
        "v": _rule((int,), SCHEMA_VERSION, SCHEMA_VERSION),
    }

    def _check(self) -> None:
        if self.state not in ("online", "offline"):
            raise TelemetryError("out_of_range", f"state {self.state!r}")


def _check_fields(obj: Any) -> None:
    for name, (types, low, high, optional) in obj.RULES.items():
        value = getattr(obj, name)
        if value is None:
            if not optional:
                raise TelemetryError("bad_type", f"{name} is missing")
            continue
        # bool is an int in Python: refuse it where a number is expected, and vice versa.
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            raise TelemetryError("bad_type", f"{name} has type {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise TelemetryError("out_of_range", f"{name} is not finite")
        if (low is not None and value < low) or (high is not None and value > high):
            raise TelemetryError("out_of_range", f"{name}={value!r}")
        if isinstance(value, str) and name == "device_id" and not valid_id(value):
            raise TelemetryError("bad_type", "device_id is not a valid id")
        if isinstance(value, str) and len(value) > 128:
            raise TelemetryError("out_of_range", f"{name} is longer than 128 characters")


def _refuse_constant(name: str) -> None:
    raise TelemetryError("out_of_range", f"{name} is not a JSON number")


def _load(payload: bytes, cls: type) -> dict[str, Any]:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise TelemetryError("oversized", f"{len(payload)} bytes")
    try:
        data = json.loads(payload, parse_constant=_refuse_constant)
    except TelemetryError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise TelemetryError("not_json", str(exc)[:80]) from None
    if not isinstance(data, dict):
        raise TelemetryError("bad_schema", "payload is not an object")
    if data.get("v") != SCHEMA_VERSION:
        raise TelemetryError("bad_version", f"v={data.get('v')!r}")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise TelemetryError("bad_schema", f"unknown fields {sorted(unknown)[:3]}")
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = required - set(data)
    if missing:
        raise TelemetryError("bad_schema", f"missing fields {sorted(missing)[:3]}")
    return data
