"""One device as a policy sees it when it plans: the registry's latest word on it, and its data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgesched.core.registry import DeviceState
from edgesched.core.telemetry import Heartbeat


@dataclass(frozen=True)
class DeviceView:
    """What the adapter knows of one online device when a round is planned."""

    device: str
    samples: int  # local training set size
    heartbeat: Heartbeat | None = None
    board: str | None = None
    battery_drain_pct_s: float | None = None  # from its heartbeat history; > 0 means falling
    speed_test_sps: float | None = None  # samples/s its agent inferred with the run's model (onnxruntime)


def battery_drain(history: Sequence[Heartbeat]) -> float | None:
    """Percent per second the battery fell over the recent unplugged heartbeats (None: unknown)."""
    points = [(hb.sent_at, hb.battery_percent) for hb in history
              if hb.battery_percent is not None and not hb.charging]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[0][1] - points[-1][1]) / (points[-1][0] - points[0][0])


def device_view(state: DeviceState, samples: int, history: Sequence[Heartbeat],
                device: str | None = None, dataset: str | None = None) -> DeviceView:
    """A registry entry as the planner sees it (`device`: the id to plan under, if not its own;
    `dataset`: the run's, whose model a speed test must have timed to count)."""
    hb = state.heartbeat
    drain = battery_drain(history) if hb is not None and hb.battery_percent is not None else None
    caps = state.capabilities
    board = caps.board if caps else None
    tested = caps.speedtest_infer_sps if caps and dataset and caps.speedtest_model == dataset else None
    return DeviceView(device or state.device_id, samples, hb, board, drain, tested)
