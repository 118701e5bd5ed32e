"""Model updates in fewer bits: row-scaled quantization, error feedback, and the bit-width per job.

A tensor is cut into rows (its first axis; a vector is one row). Each row is sent as one float32
scale and one signed code of `bits` bits per value, rounded to the nearest level and packed
8 / bits to a byte: 8 bits keep 127 levels each side of zero, 4 keep 7, 2 keep 1 (-1, 0 or +1
times the row's scale). A float32 model is about 4x, 8x or 16x smaller.

The scale is the one of `CLIPS` (shares of the row's largest magnitude over the widest code)
that loses least: clipping a few large values buys finer levels for all the others (Banner et
al., 2019). At 2 bits a scale set by the peak rounds nearly every value to zero; the best clip
loses about half as much (tests/core/test_compress.py).

A device keeps what it lost (`ErrorFeedback`) and adds it to its next update, so nothing is
dropped for good: what it sends over many jobs sums to what it computed, less one job's
rounding. The gateway sends the global model the same way, as the difference from what the
device already holds (edgesched.core.downlink), so each download also carries what earlier
ones rounded away.

Which width a job gets (`choose_bits`): the widest of `ADAPTIVE_BITS` whose transfers keep
within a share of the job's time. A device whose link is fast for its work sends 8 bits; one
whose link would hold the job up sends 4. Not 2: three levels round away a fifth to a quarter
of an update's squared size (4 bits: 1-3 %), and error feedback returns it only with the
device's next job, which on a fleet whose phones come and go can be minutes away or never
(docs/benchmarks.md measures what each width saves and costs). A fixed width may still be 2.

Numpy only; `decode` checks everything a payload says against the shapes the gateway expects
and raises `Malformed` instead of trusting it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BITS = (8, 4, 2)  # the widths a job may be given, widest first
ADAPTIVE_BITS = (8, 4)  # the widths `choose_bits` picks from, widest first
DOWNLINK_BITS = 8  # the global model's differences go out at this width
CLIPS = (1.0, 0.8, 0.6, 0.45, 0.35, 0.25, 0.18)  # a row's scales tried, as shares of its peak's


class Malformed(ValueError):
    """A compressed payload that does not fit the model it claims to update."""


@dataclass(frozen=True)
class Packed:
    """One tensor in `bits` bits: packed codes (uint8) and one float32 scale per row."""

    codes: np.ndarray
    scales: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes)


def levels(bits: int) -> int:
    """Codes each side of zero at this width."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, not {bits}")
    return int(2 ** (bits - 1) - 1)


def _rows(shape: Sequence[int]) -> int:
    return int(shape[0]) if len(shape) >= 2 else 1


def packed_nbytes(shapes: Sequence[Sequence[int]], bits: int) -> int:
    """Bytes a model of these tensor shapes takes at `bits` (codes and scales)."""
    return sum(math.ceil(math.prod(s) * bits / 8) + 4 * _rows(s) for s in shapes)


def quantize(tensor: np.ndarray, bits: int) -> Packed:
    """`tensor` in `bits` bits: per row, the scale of `CLIPS` with the least squared rounding
    error, each value rounded to its nearest level (and clipped to the outermost)."""
    top = levels(bits)
    rows = tensor.astype(np.float32).reshape(_rows(tensor.shape), -1)
    with np.errstate(invalid="ignore"):  # NaN in, NaN scales out: the gateway refuses those
        peak = np.abs(rows).max(axis=1) if rows.size else np.zeros(len(rows), np.float32)
        scales = peak * np.float32(CLIPS[0] / top)
        codes, least = _round(rows, scales, top)
        for clip in CLIPS[1:]:
            tried = peak * np.float32(clip / top)
            tried_codes, lost = _round(rows, tried, top)
            better = lost < least  # never for a NaN row: it keeps its peak's scale
            scales = np.where(better, tried, scales)
            codes = np.where(better[:, None], tried_codes, codes)
            least = np.where(better, lost, least)
    return Packed(_pack((codes + top).astype(np.uint8).ravel(), bits), scales.astype(np.float32))


def _round(rows: np.ndarray, scales: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's values as codes of its scale (clipped to `top` levels each side), and what that loses."""
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    codes = np.nan_to_num(np.clip(np.rint(rows / safe[:, None]), -top, top))
    lost = ((codes * safe[:, None] - rows) ** 2).sum(axis=1)
    return codes, lost


def dequantize(packed: Packed, shape: Sequence[int], bits: int) -> np.ndarray:
    """The float32 tensor of `shape` that `packed` stands for; Malformed if it cannot be one."""
    top, size, rows = levels(bits), math.prod(shape), _rows(shape)
    codes, scales = packed.codes, packed.scales
    if codes.dtype != np.uint8 or codes.ndim != 1 or len(codes) != math.ceil(size * bits / 8):
        raise Malformed(f"codes for {tuple(shape)} at {bits} bits must be {math.ceil(size * bits / 8)} bytes")
    if scales.dtype != np.float32 or scales.shape != (rows,):
        raise Malformed(f"scales for {tuple(shape)} must be {rows} float32")
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise Malformed("scales must be finite and >= 0")
    values = _unpack(codes, bits, size)
    if values.size and int(values.max()) > 2 * top:
        raise Malformed(f"a code beyond the {2 * top + 1} levels of {bits} bits")
    return _expand(values, scales, shape, bits)


def _expand(values: np.ndarray, scales: np.ndarray, shape: Sequence[int], bits: int) -> np.ndarray:
    signed = values.astype(np.float32).reshape(_rows(shape), -1) - levels(bits)
    tensor: np.ndarray = (signed * scales[:, None]).reshape(tuple(shape))
    return tensor


def encode(tensors: Sequence[np.ndarray], bits: int) -> list[Packed]:
    return [quantize(t, bits) for t in tensors]


def decode(packed: Sequence[Packed], shapes: Sequence[Sequence[int]], bits: int) -> list[np.ndarray]:
    if len(packed) != len(shapes):
        raise Malformed(f"{len(packed)} tensors where the model has {len(shapes)}")
    return [dequantize(p, s, bits) for p, s in zip(packed, shapes, strict=True)]


class ErrorFeedback:
    """What a device's earlier updates lost to rounding, added to its next (Seide et al., 2014;
    Karimireddy et al., 2019): the sum of what it sends tracks the sum of what it computed.

    The server divides each update by its job's local steps (FedNova), so the residual is kept
    per step and added back times the next job's steps: carried into a short job, what a long
    one lost then weighs in the model as much as it would have in the job that lost it, not
    many times more."""

    def __init__(self, residual: list[np.ndarray] | None = None) -> None:
        self.residual = residual  # per local step

    def compress(self, update: Sequence[np.ndarray], bits: int, steps: int) -> list[Packed]:
        """`update` (the change of a job of `steps` local steps) plus the residual, in `bits` bits."""
        per = max(int(steps), 1)
        corrected = [u.astype(np.float32) for u in update]
        if self.residual is not None and [r.shape for r in self.residual] == [c.shape for c in corrected]:
            corrected = [c + np.float32(per) * r for c, r in zip(corrected, self.residual, strict=True)]
        packed = encode(corrected, bits)
        residual = [(c - _expand(_unpack(p.codes, bits, c.size), p.scales, c.shape, bits)) / np.float32(per)
                    for c, p in zip(corrected, packed, strict=True)]
        # A broken update (NaN, inf) is refused at the gateway; it must not poison every later one.
        self.residual = residual if all(np.isfinite(r).all() for r in residual) else None
        return packed


def choose_bits(transfer_s: np.ndarray, compute_s: np.ndarray, max_share: float) -> np.ndarray:
    """Per device, the widest of ADAPTIVE_BITS whose transfers (`transfer_s`: a full float32 model
    down and up) take at most `max_share` of the job; the narrowest where none does. The download
    is always DOWNLINK_BITS wide, so only the upload shrinks further."""
    chosen = np.full(len(transfer_s), ADAPTIVE_BITS[-1], dtype=np.int64)
    for bits in reversed(ADAPTIVE_BITS[:-1]):
        moved = transfer_s * transfer_ratio(np.array([bits]))
        fits = moved <= max_share * (moved + compute_s)
        chosen[fits] = bits
    return chosen


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return codes
    per = 8 // bits
    padded = np.zeros(math.ceil(len(codes) / per) * per, dtype=np.uint8)
    padded[:len(codes)] = codes
    lanes = padded.reshape(-1, per)
    out = np.zeros(len(lanes), dtype=np.uint8)
    for j in range(per):
        out |= (lanes[:, j] << (bits * j)).astype(np.uint8)
    return out


def _unpack(packed: np.ndarray, bits: int, size: int) -> np.ndarray:
    if bits == 8:
        return packed
    per, mask = 8 // bits, (1 << bits) - 1
    lanes = np.stack([(packed >> (bits * j)) & mask for j in range(per)], axis=1)
    return lanes.ravel()[:size]


def transfer_ratio(bits: np.ndarray) -> np.ndarray:
    """A job's bytes moved, both ways, over a float32 model's each way (scales left out): 1.0 for an
    uncompressed job (bits 0), else its download at DOWNLINK_BITS and upload at `bits`."""
    ratio: np.ndarray = np.where(bits > 0, (DOWNLINK_BITS + bits) / 64.0, 1.0)
    return ratio
