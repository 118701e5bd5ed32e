"""Bad input ends in one line on stderr and a non-zero exit code: never a traceback."""

import os
import subprocess
import sys

import pytest

from edgesched.files import hold_lock, write_checkpoint
from edgesched.observe import LOCK_FILE


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "edgesched", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)


NEED_FLEET = "--dropout, --bad-updates, --malicious, --attack, --broker, --compare and --engine need --fleet"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["simulate", "--dataset", "cifar"], 1, "dataset: unknown 'cifar'"),
        (["simulate", "--data-dir", "/nonexistent/fmnist"], 1, "not found in /nonexistent/fmnist"),
        (["simulate", "--dataset", "hapt"], 1, "hapt needs --data-dir"),
        (["simulate", "--rounds", "ten"], 2, "'ten' is not a valid integer"),
        (["simulate", "--rounds", "0"], 1, "rounds: must be >= 1"),
        (["simulate", "--fraction-train", "2"], 1, "fraction-train: must be in (0, 1]"),
        (["simulate", "--epochs", "3"], 2, "No such option"),
        (["launch"], 2, "No such command"),
    ],
)
def test_bad_input_is_one_clear_line(args, code, says):
    result = _run(*args)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgesched: error: ") and says in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_a_finished_run_is_never_overwritten(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    result = _run("simulate", "--dataset", "digits", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "already holds a finished run" in result.stderr
    assert (tmp_path / "summary.json").read_text() == "{}"


def test_a_run_directory_another_process_is_writing_is_refused_untouched(tmp_path):
    with hold_lock(tmp_path / LOCK_FILE, "held"):  # a run going on there
        result = _run("simulate", "--dataset", "digits", "--rounds", "1", "--out", str(tmp_path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "another process is writing a run there" in lines[0], result.stderr
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_FILE]


def test_help_teaches_the_options():
    result = _run("simulate", "--help")
    assert result.returncode == 0
    for option in ("--dataset", "--data-dir", "--clients", "--rounds", "--seed", "--out", "--alpha"):
        assert option in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--broker", "tcp://gw:1883", "--device-id", "pi-1"], "expected mqtt://host[:port]"),
        (["--broker", "mqtt://gw", "--device-id", "pi 1"], "--device-id 'pi 1'"),
        (["--broker", "mqtt://gw", "--device-id", "pi-1", "--interval", "0"], "--interval must be > 0"),
        (["--broker", "mqtts://gw", "--device-id", "pi-1", "--ca-file", "/no/ca.pem"], "CA file /no/ca.pem"),
        (["--device-id", "pi-1"], "Missing option '--broker'"),
        (["--broker", "mqtt://gw", "--device-id", "pi-1", "--speed-test", "cifar"], "--speed-test 'cifar'"),
    ],
)
def test_agent_bad_input_is_one_clear_line(args, says):
    result = _run("agent", *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fleet", "garage-3"], "fleet file garage-3 not found; shipped fleets:"),
        (["--dropout", "0.2"], NEED_FLEET),
        (["--broker", "embedded"], NEED_FLEET),
        (["--engine", "in-process"], NEED_FLEET),
        (["--compare", "fedavg"], NEED_FLEET),
        (["--fleet", "lab-20", "--compare", "fedsgd"], "--compare: unknown strategy 'fedsgd'; choose one of"),
        (["--fleet", "lab-20", "--engine", "in-process", "--ray-address", "127.0.0.1:1"],
         "--ray-address runs the training on a Ray cluster: it needs --engine ray"),
        (["--fleet", "lab-20", "--dashboard", "--dashboard-port", "70000", "--rounds", "1"],
         "--dashboard-port 70000: expected 1-65535"),
        (["--fleet", "lab-20", "--engine", "threads"], "--engine: unknown 'threads'; choose one of ray, in-process"),
        (["--fleet", "lab-20", "--bad-updates", "1.5"], "--bad-updates must be in [0, 1]"),
        (["--fleet", "lab-20", "--malicious", "-0.1"], "--malicious must be in [0, 1]"),
        (["--fleet", "lab-20", "--attack", "bribe"], "--attack: unknown 'bribe'; choose one of sign-flip, scale"),
        (["--attack", "nan"], "--malicious, --attack, --broker, --compare and --engine need --fleet"),
        (["--fleet", "lab-20", "--strategy", "oort"], "strategy: choose one of fedavg, fedprox, deadline, fedbuff, "
                                                      "edgesched, edgesched-no-prediction"),
        (["--strategy", "oort"], "strategy: choose one of fedavg, fedprox,"),
        (["--strategy", "fedbuff"], "--strategy fedbuff is a baseline for virtual fleets: it needs --fleet"),
        (["--fleet", "lab-20", "--broker", "mqtt://127.0.0.1:1"], "cannot reach the MQTT broker at mqtt://127.0.0.1:1"),
        (["--fleet", "lab-20", "--broker", "http://x"], "broker URL 'http://x': expected mqtt://"),
        (["--fleet", "lab-20", "--dropout", "2"], "--dropout must be in [0, 1]"),
        (["--fleet", "lab-20", "--scheduler", "min-round-share=0"], "min-round-share: must be in (0, 1], got 0.0"),
        (["--fleet", "lab-20", "--scheduler", "rounds=3"], "--scheduler: 'rounds' is not a scheduler setting"),
        (["--fleet", "lab-20", "--strategy", "fedbuff", "--scheduler", "max-staleness=2"],
         "--scheduler sets the adaptive scheduler, which --strategy fedbuff does not use"),
        (["--scheduler", "max-staleness=2"], "which --strategy fedavg does not use"),
    ],
)
def test_fleet_bad_input_is_one_clear_line(args, says):
    result = _run("simulate", *args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


class RunsACommand:
    """Unpickled, this runs `os.system(command)`: what a hostile checkpoint would carry."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize(
    ("setup", "extra", "says"),
    [
        ("missing", [], "no run directory"),
        ("empty", [], "no checkpoint (Flower's own strategies, fedavg and fedprox, write none"),
        ("finished", [], "holds a finished run: nothing to resume"),
        ("garbage", [], "checkpoint.bin: not an edgesched checkpoint"),
        ("crafted", [], "refers to posix.system, which no checkpoint holds; refused unread"),
        ("damaged", [], "damaged (its checksum does not match); nothing was loaded"),
        ("empty", ["--seed", "3"], "--resume continues the run with its own settings; drop --seed"),
    ],
)
def test_resume_bad_input_is_one_clear_line(tmp_path, setup, extra, says):
    run_dir = tmp_path / "run"
    if setup != "missing":
        run_dir.mkdir()
    if setup == "finished":
        (run_dir / "summary.json").write_text("{}")
    if setup == "garbage":
        (run_dir / "checkpoint.bin").write_bytes(b"not a pickle")
    if setup in ("crafted", "damaged"):  # a checkpoint that would run a command if unpickled
        write_checkpoint(run_dir / "checkpoint.bin", RunsACommand(f"touch {tmp_path / 'pwned'}"))
    if setup == "damaged":  # ... whose payload then lost a bit: the checksum sees it first
        raw = bytearray((run_dir / "checkpoint.bin").read_bytes())
        raw[-3] ^= 0x01
        (run_dir / "checkpoint.bin").write_bytes(bytes(raw))
    result = _run("simulate", "--resume", str(run_dir), *extra)
    assert not (tmp_path / "pwned").exists()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("/dev/null/run", "--out /dev/null/run: cannot create the run directory (Not a directory)"),
        ("FILE", "--out FILE: cannot create the run directory (a file of that name exists)"),
        ("FILE/run", "--out FILE/run: cannot create the run directory (Not a directory)"),
    ],
)
def test_an_out_that_cannot_be_a_directory_is_one_clear_line(tmp_path, out, says):
    (tmp_path / "file").write_text("not a directory")
    out, says = (s.replace("FILE", str(tmp_path / "file")) for s in (out, says))
    result = _run("simulate", "--dataset", "digits", "--rounds", "1", "--out", out)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"edgesched: error: {says}", result.stderr


def _finished_run(run_dir):
    """What export reads of a finished digits run: config.json and model.npz (untrained weights)."""
    import numpy as np

    from edgesched.tasks import build_model

    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"dataset": "digits"}')
    np.savez(run_dir / "model.npz", **{k: v.numpy() for k, v in build_model("digits").state_dict().items()})


@pytest.mark.parametrize(
    ("damage", "out", "says"),
    [
        (None, "/dev/null/model.onnx", "--out /dev/null/model.onnx: cannot write the ONNX file (Not a directory)"),
        (None, "FILE/model.onnx", "--out FILE/model.onnx: cannot write the ONNX file (Not a directory)"),
        (None, "RUN", "--out RUN: cannot write the ONNX file (Is a directory)"),
        ("truncate", None, "RUN/model.npz: not an .npz archive (truncated or overwritten?)"),
        ("garbage", None, "RUN/model.npz: not an .npz archive (truncated or overwritten?)"),
        ("empty", None, "RUN/model.npz: not an .npz archive (truncated or overwritten?)"),
        ("other-model", None, "RUN/model.npz: not the digits model's weights "
                              "(missing, extra or misshapen: net.0.bias, net.0.weight, net.2.bias, ...)"),
        ("config", None, "RUN/config.json: not a run's config (Expecting"),
    ],
)
def test_export_bad_input_is_one_clear_line(tmp_path, damage, out, says):
    run_dir = tmp_path / "run"
    _finished_run(run_dir)
    (tmp_path / "file").write_text("not a directory")
    model = run_dir / "model.npz"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:len(model.read_bytes()) // 2])
    if damage == "garbage":
        model.write_text("not a model")
    if damage == "empty":
        model.write_bytes(b"")
    if damage == "other-model":
        import numpy as np

        np.savez(model, w=np.zeros(3))
    if damage == "config":
        (run_dir / "config.json").write_text('{"dataset": ')
    out, says = (s and s.replace("RUN", str(run_dir)).replace("FILE", str(tmp_path / "file")) for s in (out, says))
    result = _run("export", "--onnx", str(run_dir), *(["--out", out] if out else []))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgesched: error: {says}"), result.stderr
    assert not (run_dir / "model.onnx").exists()
