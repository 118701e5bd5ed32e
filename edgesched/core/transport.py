"""The engine's seams: the Transport that carries jobs and the FleetView it reads (the Clock: core.clock).

Two implementations of each: on a gateway, Flower's Grid (edgesched.flower), the wall clock and
the MQTT registry; on one machine, the virtual fleet and its clock (edgesched.simulations). The
engine and the policies see only these protocols, so both run the same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgesched.core.fleet import DeviceView
from edgesched.core.records import JobMetrics


@dataclass(frozen=True)
class Order:
    """Work the policy wants a device to do now."""

    device: str
    epochs: int | None = None  # passes the client may start; None: the run's local epochs
    steps: int | None = None  # SGD steps that end the job; None: no cap
    bits: int = 0  # the update's width (edgesched.core.compress), the model sent as a difference; 0: float32


@dataclass(frozen=True)
class Bounds:
    """What a job's reply may truthfully report, from the gateway's own figures, never the
    device's: the partition it was sent to train, that partition's size (its weight in every
    average), the most SGD steps its order allows, and the mini-batch size."""

    partition: int
    examples: int
    max_steps: int
    batch_size: int

    @classmethod
    def of(cls, order: Order, partition: int, examples: int, local_epochs: int, batch_size: int) -> Bounds:
        """An order's bounds on a partition of `examples` samples (`local_epochs`: the run's,
        for an order that names none)."""
        epochs = order.epochs if order.epochs is not None else local_epochs
        steps = epochs * -(-examples // batch_size)
        return cls(partition, examples, steps if order.steps is None else min(steps, order.steps), batch_size)


@dataclass(frozen=True)
class Batch:
    """Orders sent at one moment; with a hard `deadline`, replies after it are never read."""

    orders: Sequence[Order]
    deadline: float | None = None


@dataclass(frozen=True)
class Reply:
    """What came back for a job, decoded by the transport and not yet trusted.

    Exactly one of `refusal` (refused unread, e.g. "oversized"), `error` (no weights: the client
    or the transport failed) or `trained` is set; `metrics` is None when the reported figures
    are missing or not finite numbers.
    """

    job_id: str
    node: int  # the transport's address of the device that answered
    device_claim: str | None  # the device id the reply names
    trained: list[np.ndarray] | None = None
    metrics: JobMetrics | None = None
    error: str | None = None
    refusal: str | None = None
    delta: bool = False  # `trained` is the change from the model the job started from (a compressed reply)
    moved: tuple[int, int] = (0, 0)  # model bytes the job carried down and its reply up


class Unsent(Exception):
    """The transport refused a job (e.g. its node has just left); the message says why."""


class Transport(Protocol):
    def send(self, device: str, step: int, order: Order, model: list[np.ndarray], deadline: float | None) -> str:
        """Start `order` on `device` with the step's model; its job id. Raises Unsent."""

    def bounds(self, device: str, order: Order) -> Bounds:
        """What a reply to `order` on `device` may report (the reply is checked against it)."""

    def collect(self, job_ids: Sequence[str], max_bytes: float) -> list[Reply]:
        """Replies that have come for these jobs, in arrival order; one carrying more tensor
        bytes than `max_bytes` is refused before it is decoded."""

    def reachable(self, now: float) -> list[str]:
        """Devices the transport can reach now and that are not busy, in address order."""

    def next_change(self, now: float) -> float:
        """When the reachable devices may next be different."""


class FleetView(Protocol):
    def views(self, now: float) -> list[DeviceView]:
        """The devices online now, as the registry sees them."""

    def session(self, device: str, now: float) -> int | None:
        """The device's current agent session (0: not known yet), or None if it is offline."""

    def seen(self, node: int, device_id: str) -> None:
        """A reply from `node` named the device it runs on."""

    def size(self) -> int:
        """Devices in the fleet, online or not."""
