"""The ClientApp called the way a SuperNode calls it: a train message in, a reply out."""

import subprocess
import sys
import time

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, MessageType, Metadata, RecordDict
from flwr.app.message.message import make_message

from edgesched.clients.app import app
from edgesched.config import RunConfig
from edgesched.errors import EdgeschedError
from edgesched.flower.messages import job_config
from edgesched.tasks import build_model

PI = {"device-id": "pi4-lab-07"}


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Where a board's ClientApp leaves its job reports and its decoded partition."""
    monkeypatch.setenv("EDGESCHED_STATE_DIR", str(tmp_path))
    return tmp_path / "edgesched"


def _call(message_type: str, partition_id: int, node_config: dict):
    cfg = RunConfig.from_mapping({"dataset": "digits", "clients": 5, "local-epochs": 2})
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="1",
        created_at=time.time(), ttl=60, message_type=message_type,
    )
    content = RecordDict({
        "arrays": ArrayRecord(build_model("digits").state_dict()),
        "config": ConfigRecord(job_config(cfg, 1, partition_id)),
    })
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})
    reply = app(make_message(metadata, content), context)
    assert not reply.has_error(), reply.error
    return reply


def test_train_reply_reports_what_it_did_and_how_fast():
    reply = _call(MessageType.TRAIN, partition_id=2, node_config=PI)
    m = reply.content["metrics"]
    assert m["partition-id"] == 2
    assert m["samples"] == 2 * m["num-examples"] > 0  # two local epochs
    assert m["steps"] == 2 * -(-m["num-examples"] // 32)
    assert m["seconds"] > 0
    assert m["samples-per-second"] == pytest.approx(m["samples"] / m["seconds"])
    assert reply.content["device"]["device-id"] == "pi4-lab-07"
    assert set(reply.content["arrays"]) == set(build_model("digits").state_dict())


def test_evaluate_reply_and_default_device_id():
    reply = _call(MessageType.EVALUATE, partition_id=0, node_config={})
    m = reply.content["metrics"]
    assert 0.0 <= m["accuracy"] <= 1.0 and m["num-examples"] > 0
    assert reply.content["device"]["device-id"] == "node-7"
    assert "arrays" not in reply.content


def test_a_board_keeps_its_partition_decoded_between_jobs(state_dir):
    simulated = _call(MessageType.TRAIN, partition_id=3, node_config={})  # in memory: nothing written
    assert not (state_dir / "partitions").exists()
    first = _call(MessageType.TRAIN, partition_id=3, node_config=PI)
    (cached,) = (state_dir / "partitions").iterdir()
    with np.load(cached) as saved:
        assert len(saved["y"]) == first.content["metrics"]["num-examples"]
    again = _call(MessageType.TRAIN, partition_id=3, node_config=PI)  # read from the cache
    for reply in (first, again):  # the same data, so the same seeded job gives the same weights
        for name, array in simulated.content["arrays"].items():
            assert np.array_equal(reply.content["arrays"][name].numpy(), array.numpy()), name
    cached.write_bytes(b"torn by a power cut")
    assert _call(MessageType.TRAIN, partition_id=3, node_config=PI).content["metrics"]["num-examples"] > 0
    with np.load(cached) as saved:  # rebuilt
        assert len(saved["y"]) == first.content["metrics"]["num-examples"]


def test_a_query_names_the_device_without_loading_torch():
    code = """
import sys, time
from flwr.app import Context, Metadata, RecordDict
from flwr.app.message.message import make_message
from edgesched.clients.app import app
metadata = Metadata(run_id=1, message_id="q", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="id",
                    created_at=time.time(), ttl=60, message_type="query")
context = Context(run_id=1, node_id=7, node_config={"device-id": "pi4-lab-07"}, state=RecordDict(), run_config={})
reply = app(make_message(metadata, RecordDict()), context)
print(reply.content["device"]["device-id"], "torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["pi4-lab-07", "False"], done.stderr[-2000:]


def _job(arrays: ArrayRecord, config: dict) -> tuple:
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="1",
        created_at=time.time(), ttl=60, message_type=MessageType.TRAIN,
    )
    context = Context(run_id=1, node_id=7, node_config=PI, state=RecordDict(), run_config={})
    return make_message(metadata, RecordDict({"arrays": arrays, "config": ConfigRecord(config)})), context


def test_a_board_trains_compressed_jobs_from_the_copy_it_holds_and_replies_in_their_width(state_dir):
    """As a gateway sends them: the model as a difference from the board's copy, the update asked
    in 4 bits; the board's reply decodes to its change, and the next job builds on the copy."""
    from edgesched.core.downlink import Holdings
    from edgesched.flower.messages import BASE_MISSING, Compressed, decode_reply, model_record, packed_record

    cfg = RunConfig.from_mapping({"dataset": "digits", "clients": 5, "local-epochs": 1})
    weights = {k: v.detach().numpy().copy() for k, v in build_model("digits").state_dict().items()}
    keys, shapes = list(weights), [w.shape for w in weights.values()]
    holdings = Holdings()
    computed = sent = [np.zeros(s) for s in shapes]
    for step in (1, 2):
        download = holdings.download("pi4-lab-07", list(weights.values()))
        config = {**job_config(cfg, step, 2), "uplink-bits": 4, "downlink-bits": download.bits,
                  "downlink-base": download.base, "downlink-tag": download.tag}
        reply = app(*_job(packed_record(keys, download.packed), config))
        assert not reply.has_error(), reply.error
        decoded = decode_reply(reply, "m1", 1e9, Compressed(keys, shapes, 4))
        assert decoded.refusal is None and decoded.delta and decoded.trained is not None
        assert decoded.moved[1] < sum(w.nbytes for w in weights.values()) / 6
        # the same job uncompressed, from the model the board rebuilt: what the board sent over both
        # jobs, per local step as the server counts it, adds up to what it computed less the
        # residual it keeps on disk for its next job
        exact = app(*_job(model_record(keys, download.rebuilt), job_config(cfg, step, 2)))
        changes = [t - r for t, r in zip(exact.content["arrays"].to_numpy_ndarrays(), download.rebuilt, strict=True)]
        steps = decoded.metrics.steps
        computed = [c + e / steps for c, e in zip(computed, changes, strict=True)]
        sent = [s + d / steps for s, d in zip(sent, decoded.trained, strict=True)]
        with np.load(next(state_dir.rglob("residual.npz"))) as kept:
            residual = [kept[k] for k in keys]
        for c, s, r in zip(computed, sent, residual, strict=True):
            np.testing.assert_allclose(s + r, c, atol=1e-6)
            assert np.abs(r).max() < np.abs(c).max()  # a remainder, not the update held back
        holdings.sent("m1", "pi4-lab-07", download)
        holdings.confirm("m1")
        assert download.base == ("" if step == 1 else "pi4-lab-07#1")
        weights = {k: w + d for (k, w), d in zip(weights.items(), decoded.trained, strict=True)}
    # a difference from a copy the board never had: an error (a SuperNode replies with its text) that
    # the gateway recognises, and sends the whole model next
    config = {**job_config(cfg, 3, 2), "uplink-bits": 4, "downlink-bits": 8, "downlink-base": "pi4-lab-07#99",
              "downlink-tag": "pi4-lab-07#100"}
    with pytest.raises(EdgeschedError, match=BASE_MISSING):
        app(*_job(packed_record(keys, download.packed), config))
