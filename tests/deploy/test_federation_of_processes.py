"""A real federation on loopback: Mosquitto with TLS, Flower's SuperLink, the edgesched ServerApp,
four SuperNodes and four device agents, each its own process. One device's SuperNode and agent
are killed mid-run: its Last Will reaches the gateway through MQTT, its job is dropped within
seconds (Flower alone notices a dead SuperNode after about a minute), and the run goes on.
Then the broker is down for 10 s during round 2: the gateway keeps scheduling on what it last
heard, and both sides reconnect. Then the ServerApp itself is SIGKILLed in round 3; submitted
again, it goes on from its last checkpoint, and the run ends with a model and every round
recorded once."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from edgesched.broker import free_port

from ..mqtt.brokers import MOSQUITTO, Mosquitto, password_file, shipped_config

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
DEVICES = ("pi-a", "pi-b", "pi-c", "pi-d")
APP = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "edgesched-e2e"
version = "1.0.0"
description = "edgesched on a loopback federation"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "edgesched"

[tool.flwr.app.components]
serverapp = "edgesched.server.app:app"
clientapp = "edgesched.clients.app:app"

[tool.flwr.app.config]
dataset = "digits"
strategy = "edgesched"
rounds = 3
clients = 4
fraction-train = 0.75
min-deadline = 30.0
round-timeout = 120.0
heartbeat-interval = 0.5
"""


class Processes:
    """Started processes by name, each logging to its own file; all stopped at the end."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env, self.procs = folder, env, {}

    def start(self, name: str, *cmd: str | Path, **env: str) -> subprocess.Popen:
        log = (self.folder / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                                            env={**self.env, **env}, start_new_session=True)
        return self.procs[name]

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # ended meanwhile, or a zombie
        return ""


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto is not installed (make test installs it)")
def test_a_device_killed_mid_run_is_dropped_through_mqtt_and_the_run_ends_with_a_model(tmp_path):
    password_file(tmp_path, {"gateway": "gw-secret", **{d: f"{d}-secret" for d in DEVICES}})
    broker = Mosquitto(tmp_path, shipped_config(tmp_path), tls=True).start()
    ca, link = tmp_path / "ca.crt", free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{link}"\ninsecure = true\n')
    (tmp_path / "app").mkdir()
    out = tmp_path / "run"
    procs = Processes(tmp_path, {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                                 "PATH": f"{BIN}:{os.environ['PATH']}"})
    try:
        procs.start("superlink", BIN / "flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                    "--port", str(link), EDGESCHED_MQTT_PASSWORD="gw-secret")
        for device in DEVICES:
            state = tmp_path / f"state-{device}"  # where the ClientApp leaves job speeds for the agent
            procs.start(f"supernode-{device}", BIN / "flower-supernode", "--insecure", "--superlink",
                        f"127.0.0.1:{link}", "--port", str(free_port()), "--node-config", f"device-id='{device}'",
                        EDGESCHED_STATE_DIR=str(state))
            procs.start(f"agent-{device}", sys.executable, "-m", "edgesched", "agent", "--broker", broker.url,
                        "--device-id", device, "--username", device, "--ca-file", ca, "--interval", "0.5",
                        "--keepalive", "2", EDGESCHED_STATE_DIR=str(state), EDGESCHED_MQTT_PASSWORD=f"{device}-secret")
        (tmp_path / "app" / "pyproject.toml").write_text(
            f"{APP}broker = 'mqtts://gateway@localhost:{broker.port}'\nbroker-ca-file = '{ca}'\nout-dir = '{out}'\n"
            f"checkpoint-dir = '{tmp_path / 'checkpoints'}'\n")
        superlink_log = tmp_path / "superlink.log"
        _wait(lambda: superlink_log.read_text(errors="replace").count("Activated node_id") >= len(DEVICES), 60,
              "four SuperNodes registered")

        run = procs.start("flwr-run", BIN / "flwr", "run", tmp_path / "app", "local", "--stream")  # the ServerApp's log
        _wait(lambda: len(_rows(out / "rounds.csv")) >= 1 or run.poll() is not None, 300, "round 1")
        victim = "pi-d"
        procs.kill(f"supernode-{victim}")
        procs.kill(f"agent-{victim}")
        killed_at = time.time()
        time.sleep(2.0)  # the victim's Last Will goes out before the broker does
        broker.restart(down_seconds=10.0)  # round 2 is under way meanwhile
        _wait(lambda: len(_rows(out / "rounds.csv")) >= 2 or run.poll() is not None, 300, "round 2")
        # Flower's SuperExec starts the ServerApp in a process of its own, pointed at this SuperLink.
        server_apps = [p for p in psutil.process_iter() if "flwr-serverapp" in (c := _cmdline(p))
                       and f":{link}" in c]
        assert server_apps and run.poll() is None
        for server_app in server_apps:  # the gateway's server dies mid-round 3
            server_app.kill()
        _wait(lambda: run.poll() is not None, 120, "the stopped run's log to end")
        again = procs.start("flwr-run-again", BIN / "flwr", "run", tmp_path / "app", "local", "--stream")
        _wait(lambda: again.poll() is not None, 600, "the end of the resumed run")
        assert (out / "summary.json").exists(), (tmp_path / "flwr-run-again.log").read_text()[-3000:]
    finally:
        procs.stop_all()
        broker.stop()

    rounds = _rows(out / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [1, 2, 3] and float(rounds[-1]["accuracy"]) > 0.5
    assert int(rounds[-1]["replied"]) >= 1  # trained on after the outage and the server's restart
    assert (out / "model.npz").stat().st_size > 0
    node = re.search(r"SuperNode ID: (\d+)", (tmp_path / f"supernode-{victim}.log").read_text()).group(1)
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    dropped = [d for d in decisions if d["kind"] == "outcome" and d.get("device") == f"node-{node}"
               and d["outcome"] == "lost" and d["t"] >= killed_at]
    planned_after = [d for d in decisions if d["kind"] == "plan" and d.get("selected")
                     and d["device"] == f"node-{node}" and d["t"] > killed_at + 5]
    print(f"victim's job dropped {dropped[0]['t'] - killed_at:.1f} s after the kill" if dropped else "no job in flight")
    assert all(d["t"] - killed_at < 10 and d["reason"] == "device offline" for d in dropped)
    assert not planned_after  # offline through its Last Will: never planned again
