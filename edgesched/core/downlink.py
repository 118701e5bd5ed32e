"""The global model sent as a difference from what each device already holds.

The gateway remembers, per device, the model the device was last shown to hold: what it
rebuilt from an earlier download, confirmed by a reply to that job (a download the device may
never have received is not counted on). A new job carries `quantize(global - held)` and names
the held copy by its tag; the device adds it to its copy of that tag and keeps the result
under the new tag. A device with no confirmed copy gets the difference from zero: the whole
model, still in DOWNLINK_BITS. Rounding error does not pile up: each difference is taken from
what the device really rebuilt, so the next download carries what this one rounded away.

The device keeps its last two rebuilt copies, so a reply lost on the way (the gateway still
names the older tag) costs nothing; a device that has neither copy answers with an error and
the gateway starts it again from zero (`forget`).

Memory: one model per device that has trained, and one per job in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesched.core.compress import DOWNLINK_BITS, Packed, dequantize, encode

NO_BASE = ""  # the tag of the all-zero model every device is taken to hold at first


@dataclass(frozen=True)
class Download:
    """One job's model as sent (the difference, which copy it is from, the tag of the result), and
    the model the device rebuilds from it (float32): what it trains from."""

    packed: list[Packed]
    base: str
    tag: str
    rebuilt: list[np.ndarray]
    bits: int = DOWNLINK_BITS

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.packed)


class Holdings:
    def __init__(self) -> None:
        self._held: dict[str, tuple[str, list[np.ndarray]]] = {}  # device -> (tag, its rebuilt model)
        self._sent: dict[str, tuple[str, Download]] = {}  # job id -> (device, its download)
        self._count = 0

    def download(self, device: str, model: Sequence[np.ndarray]) -> Download:
        """What a job for `device` carries of `model`."""
        if device in self._held:
            base, held = self._held[device]
        else:  # no copy yet: the difference from zero
            base, held = NO_BASE, [np.zeros(m.shape, np.float32) for m in model]
        packed = encode([m.astype(np.float32) - h for m, h in zip(model, held, strict=True)], DOWNLINK_BITS)
        rebuilt = [np.asarray(h + dequantize(p, h.shape, DOWNLINK_BITS)) for p, h in zip(packed, held, strict=True)]
        self._count += 1
        return Download(packed, base, f"{device}#{self._count}", rebuilt)

    def sent(self, job_id: str, device: str, download: Download) -> None:
        self._sent[job_id] = (device, download)

    def confirm(self, job_id: str) -> None:
        """The job replied: its device holds what it rebuilt."""
        if (sent := self._sent.pop(job_id, None)) is not None:
            device, download = sent
            self._held[device] = (download.tag, download.rebuilt)

    def drop(self, job_id: str) -> None:
        """The job will never reply; what it carried is not counted on."""
        self._sent.pop(job_id, None)

    def forget(self, device: str) -> None:
        """The device holds no copy the gateway knows: its next download is the whole model."""
        self._held.pop(device, None)
