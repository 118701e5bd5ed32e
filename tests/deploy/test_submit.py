"""`edgesched submit` (what `edgesched-run@NAME` runs) against a real SuperLink: stopped, it stops
the run on the SuperLink, where `flwr run --stream` would leave it going; bad input is one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.processes import Processes, flower_app
from benchmarks.processes import wait_for as _wait
from edgesched.broker import free_port

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _flwr_home(folder: Path, port: int) -> Path:
    home = folder / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    return home


def _app(folder: Path) -> Path:
    """A run that waits for boards which never come: it goes on until it is stopped."""
    app = folder / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(flower_app("submit-test", "a run to stop")
                                        + f'dataset = "digits"\nclients = 2\nout-dir = "{folder / "run"}"\n')
    return app


def test_stopping_submit_stops_the_run_on_the_superlink(tmp_path):
    port = free_port()
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "FLWR_HOME": str(_flwr_home(tmp_path, port)),
           "FLWR_TELEMETRY_ENABLED": "0", "HOME": str(tmp_path)}
    procs = Processes(tmp_path, env)
    try:
        procs.start("superlink", BIN / "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                    "--disable-runtime-dependency-installation")
        _wait(lambda: subprocess.run([BIN / "flwr", "ls"], env=env, capture_output=True).returncode == 0, 60,
              "the SuperLink answering")
        submit = procs.start("submit", sys.executable, "-m", "edgesched", "submit", _app(tmp_path))
        log = tmp_path / "submit.log"
        _wait(lambda: "started" in log.read_text() or submit.poll() is not None, 120, "the run started")
        run_id = log.read_text().split("run ", 1)[1].split()[0]

        def status() -> str:
            done = subprocess.run([BIN / "flwr", "ls", "--run-id", run_id, "--format", "json"], env=env,
                                  capture_output=True, text=True)
            return json.loads(done.stdout)["runs"][0]["status"]

        _wait(lambda: status() == "running", 60, "the run running")
        time.sleep(3)  # the ServerApp waits for boards
        submit.send_signal(signal.SIGTERM)
        assert submit.wait(timeout=90) == 0, log.read_text()
        assert status() == "finished:stopped", log.read_text()
        assert "stopped on the SuperLink" in log.read_text()
        _wait(lambda: not [p for p in psutil.process_iter(["cmdline", "status"])
                           if "flwr-serverapp" in " ".join(p.info["cmdline"] or [])
                           and f":{port}" in " ".join(p.info["cmdline"] or [])
                           and p.info["status"] != psutil.STATUS_ZOMBIE], 30, "the run's ServerApp gone")
        # Bad input: one line, non-zero.
        for args in ([str(tmp_path / "nowhere")], [str(tmp_path / "app"), "no-such-superlink"]):
            done = subprocess.run([sys.executable, "-m", "edgesched", "submit", *args], env=env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
            assert done.stderr.startswith("edgesched: error: "), done.stderr
    finally:
        procs.stop_all()
