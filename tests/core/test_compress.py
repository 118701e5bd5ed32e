"""Compressed updates and downloads: rounding bounds, error feedback, the downlink's copies, the
width chosen per link, and malformed payloads refused (numpy only, plus Flower's records)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from edgesched.core.compress import (
    BITS,
    DOWNLINK_BITS,
    ErrorFeedback,
    Malformed,
    Packed,
    choose_bits,
    decode,
    dequantize,
    encode,
    levels,
    packed_nbytes,
    quantize,
)
from edgesched.core.downlink import NO_BASE, Holdings
from edgesched.flower.messages import ARRAYS, ENCODING, METRICS, Compressed, decode_reply, model_record, packed_record

SHAPES = [(16, 1, 5, 5), (16,), (10, 128), (3,)]


def model(rng: np.random.Generator, scale: float = 1.0) -> list[np.ndarray]:
    return [(scale * rng.standard_normal(s)).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("bits", BITS)
def test_a_value_within_its_rows_range_loses_at_most_half_a_level(bits: int) -> None:
    rng = np.random.default_rng(bits)
    for tensor in [*model(rng), np.zeros((4, 3), np.float32), rng.standard_normal((5, 7)).astype(np.float32) * 1e-6]:
        packed = quantize(tensor, bits)
        back = dequantize(packed, tensor.shape, bits)
        rows = tensor.reshape(tensor.shape[0] if tensor.ndim >= 2 else 1, -1)
        scale = packed.scales[:, None]
        inside = np.abs(rows) <= levels(bits) * scale
        error = np.abs(rows - back.reshape(rows.shape))
        assert (error[inside] <= (np.broadcast_to(scale, rows.shape)[inside] / 2) * (1 + 1e-5) + 1e-12).all()
        assert back.dtype == np.float32 and back.shape == tensor.shape


@pytest.mark.parametrize("bits", BITS)
def test_the_chosen_clip_loses_no_more_than_the_rows_peak_and_far_less_at_two_bits(bits: int) -> None:
    rng = np.random.default_rng(11)
    tensor = rng.laplace(size=(64, 300)).astype(np.float32)
    top = levels(bits)
    peak = np.abs(tensor).max(axis=1, keepdims=True) / top
    by_peak = np.clip(np.rint(tensor / peak), -top, top) * peak
    back = dequantize(quantize(tensor, bits), tensor.shape, bits)
    lost, lost_by_peak = ((back - tensor) ** 2).sum(axis=1), ((by_peak - tensor) ** 2).sum(axis=1)
    assert (lost <= lost_by_peak * (1 + 1e-5)).all()
    if bits == 2:  # a peak scale rounds nearly everything to zero
        assert np.linalg.norm(back - tensor) < 0.7 * np.linalg.norm(by_peak - tensor)


@pytest.mark.parametrize("bits", BITS)
def test_a_payload_is_as_large_as_its_width_says(bits: int) -> None:
    packed = encode(model(np.random.default_rng(0)), bits)
    assert sum(p.nbytes for p in packed) == packed_nbytes(SHAPES, bits)
    codes = sum(-(-int(np.prod(s)) * bits // 8) for s in SHAPES)
    assert packed_nbytes(SHAPES, bits) == codes + 4 * (16 + 1 + 10 + 1)  # and a float32 scale per row


@pytest.mark.parametrize("bits", BITS)
def test_error_feedback_sends_the_exact_sum_less_one_jobs_rounding(bits: int) -> None:
    """Over many jobs of unequal length what is sent adds up to what was computed, per local
    step as the server's FedNova step counts it: the gap is the last residual, never more than one
    job's rounding, however many jobs there were; a long job's loss is not inflated in a short one."""
    rng = np.random.default_rng(7)
    feedback = ErrorFeedback()
    computed = [np.zeros(s, np.float64) for s in SHAPES]
    sent = [np.zeros(s, np.float64) for s in SHAPES]
    gaps = []
    for _ in range(200):
        steps = int(rng.choice([1, 5, 40]))
        update = model(rng, scale=0.01 * steps)
        packed = feedback.compress(update, bits, steps)
        for c, s, u, p, shape in zip(computed, sent, update, packed, SHAPES, strict=True):
            c += u / steps
            s += dequantize(p, shape, bits) / steps
        assert feedback.residual is not None
        for c, s, r in zip(computed, sent, feedback.residual, strict=True):
            np.testing.assert_allclose(s + r, c, atol=1e-4)
        gaps.append(max(float(np.abs(c - s).max()) for c, s in zip(computed, sent, strict=True)))
    without = [np.zeros(s, np.float64) for s in SHAPES]  # the same updates, rounded with nothing kept
    rng = np.random.default_rng(7)
    for _ in range(200):
        steps = int(rng.choice([1, 5, 40]))
        for w, u in zip(without, model(rng, scale=0.01 * steps), strict=True):
            w += dequantize(quantize(u, bits), u.shape, bits) / steps
    drift = max(float(np.abs(c - w).max()) for c, w in zip(computed, without, strict=True))
    assert max(gaps[100:]) < 2 * max(gaps[:100]) + 1e-6  # bounded, not growing
    assert max(gaps) < drift


def test_error_feedback_forgets_a_broken_update() -> None:
    feedback = ErrorFeedback()
    broken = model(np.random.default_rng(1))
    broken[0][0, 0, 0, 0] = np.nan
    feedback.compress(broken, 8, steps=3)
    assert feedback.residual is None  # the gateway refuses this one; the next starts clean
    feedback.compress(model(np.random.default_rng(2)), 8, steps=3)
    assert feedback.residual is not None and all(np.isfinite(r).all() for r in feedback.residual)


def test_the_downlink_rebuilds_each_new_model_from_the_confirmed_copy() -> None:
    rng = np.random.default_rng(3)
    holdings, weights = Holdings(), model(rng)
    first = holdings.download("d1", weights)
    assert first.base == NO_BASE and first.bits == DOWNLINK_BITS
    holdings.sent("j1", "d1", first)
    holdings.confirm("j1")
    for step in range(2, 12):
        weights = [w + 0.01 * rng.standard_normal(w.shape).astype(np.float32) for w in weights]
        download = holdings.download("d1", weights)
        holdings.sent(f"j{step}", "d1", download)
        holdings.confirm(f"j{step}")
        error = max(float(np.abs(r - w).max()) for r, w in zip(download.rebuilt, weights, strict=True))
        assert error < 0.001  # the difference is small, so its rounding is too: no error piles up
    # a download never confirmed is not a base: the next one is from the last confirmed copy
    lost = holdings.download("d1", weights)
    holdings.sent("lost", "d1", lost)
    holdings.drop("lost")
    again = holdings.download("d1", weights)
    assert again.base == download.tag != lost.tag
    holdings.forget("d1")
    assert holdings.download("d1", weights).base == NO_BASE


def test_a_slow_link_gets_a_narrower_update_than_a_fast_one() -> None:
    compute = np.full(5, 10.0)
    transfer = np.array([0.1, 2.0, 4.0, 20.0, 200.0])  # a float32 model down and up, seconds
    bits = choose_bits(transfer, compute, max_share=0.1)
    assert list(bits) == sorted(bits, reverse=True)
    assert bits[0] == 8 and bits[-1] == 4  # never 2: three levels lose too much (compress.py)
    moved = transfer * (DOWNLINK_BITS + bits) / 64
    wider = np.array([{4: 8, 8: 8}[b] for b in bits])
    wider_moved = transfer * (DOWNLINK_BITS + wider) / 64
    # each got the widest width within its share, where any was
    assert all(m <= 0.1 * (m + c) or b == 4 for m, c, b in zip(moved, compute, bits, strict=True))
    assert all(w <= b or wm > 0.1 * (wm + c) for w, b, wm, c in zip(wider, bits, wider_moved, compute, strict=True))


@pytest.mark.parametrize("spoil, why", [
    (lambda p: Packed(p.codes[:-1], p.scales), "bytes"),
    (lambda p: Packed(p.codes, p.scales.astype(np.float64)), "float32"),
    (lambda p: Packed(p.codes, np.full_like(p.scales, np.nan)), "finite"),
    (lambda p: Packed(p.codes, -p.scales), ">= 0"),
    (lambda p: Packed(np.full_like(p.codes, 255), p.scales), "levels"),
    (lambda p: Packed(p.codes.astype(np.int16), p.scales), "bytes"),
])
def test_a_malformed_payload_is_refused_with_its_reason(spoil, why: str) -> None:
    packed = encode(model(np.random.default_rng(4)), 8)
    packed[2] = spoil(packed[2])
    with pytest.raises(Malformed, match=why):
        decode(packed, SHAPES, 8)
    with pytest.raises(Malformed):
        decode(packed[:3], SHAPES, 8)


KEYS = [f"t{i}" for i in range(len(SHAPES))]
FIGURES = {"partition-id": 0, "samples": 64, "steps": 2, "num-examples": 64, "seconds": 1.0,
           "samples-per-second": 64.0, "loss": 0.5}


def reply_with(arrays: ArrayRecord, bits: int | None) -> Message:
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0  # as in a ServerApp
    request = Message(RecordDict({}), dst_node_id=1, message_type="train")
    request.metadata.__dict__["_message_id"] = "job"
    content = RecordDict({ARRAYS: arrays, METRICS: MetricRecord(FIGURES)})
    if bits is not None:
        content[ENCODING] = ConfigRecord({"bits": bits})
    return Message(content, reply_to=request)


def test_a_compressed_reply_is_decoded_only_in_the_form_its_job_was_sent_in() -> None:
    change = model(np.random.default_rng(5), scale=0.01)
    job = Compressed(KEYS, SHAPES, 4)
    good = decode_reply(reply_with(packed_record(KEYS, encode(change, 4)), 4), "job", 1e9, job, 1234)
    assert good.refusal is None and good.delta and good.moved == (1234, packed_nbytes(SHAPES, 4))
    assert good.trained is not None
    for got, want in zip(good.trained, decode(encode(change, 4), SHAPES, 4), strict=True):
        np.testing.assert_array_equal(got, want)
    refused = {
        "another width": decode_reply(reply_with(packed_record(KEYS, encode(change, 8)), 8), "job", 1e9, job),
        "claims the job's width": decode_reply(reply_with(packed_record(KEYS, encode(change, 8)), 4), "job", 1e9,
                                               job),
        "not compressed": decode_reply(reply_with(model_record(KEYS, change), None), "job", 1e9, job),
        "a tensor missing": decode_reply(reply_with(packed_record(KEYS[:3], encode(change[:3], 4)), 4), "job",
                                         1e9, job),
        "compressed unasked": decode_reply(reply_with(packed_record(KEYS, encode(change, 4)), 4), "job", 1e9),
    }
    for case, reply in refused.items():
        assert reply.refusal is not None and reply.refusal.startswith("malformed"), case
        assert reply.trained is None, case
