"""The SuperLink behind the fleet gate, as deploy/gateway runs them: the SuperLink on loopback,
the gate on the boards' port. A process holding only a board's bundle (the CA certificate, a
SuperNode key) reaches the gate: an enrolled SuperNode joins through it, but registering a key
or anything else outside the Fleet API is refused there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesched.broker import free_port

from ..mqtt.brokers import make_test_ca
from .test_federation_of_processes import BIN, Processes, _wait

pytestmark = pytest.mark.slow


def flwr(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([BIN / "flwr", *args, "--format", "json"], capture_output=True, text=True, env=env,
                          timeout=60)
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else {"success": False}


def keypair(folder: Path, name: str) -> Path:
    key = folder / f"{name}.key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(key)], check=True)
    return key


def test_only_the_fleet_api_passes_the_gate(tmp_path):
    certs = make_test_ca(tmp_path)
    link, door = free_port(), free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "operator"\n'
        f'[superlink.operator]\naddress = "127.0.0.1:{link}"\nroot-certificates = "{certs["ca"]}"\n'
        f'[superlink.board]\naddress = "127.0.0.1:{door}"\nroot-certificates = "{certs["ca"]}"\n')
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "PATH": f"{BIN}:{os.environ['PATH']}"}
    procs = Processes(tmp_path, env)
    try:
        procs.start("superlink", BIN / "flower-superlink", "--host", "127.0.0.1", "--port", str(link),
                    "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key"], "--ssl-ca-certfile", certs["ca"],
                    "--enable-supernode-auth", "--database", tmp_path / "superlink.db",
                    "--disable-runtime-dependency-installation")
        procs.start("gate", sys.executable, "-m", "edgesched", "gate", "--listen", f"127.0.0.1:{door}",
                    "--superlink", f"https://127.0.0.1:{link}", "--ca-file", certs["ca"],
                    "--certfile", certs["cert"], "--keyfile", certs["key"])
        board, rogue = keypair(tmp_path, "board"), keypair(tmp_path, "rogue")
        enrolled: list[dict] = []
        _wait(lambda: enrolled.append(flwr(env, "supernode", "register", f"{board}.pub", "operator"))
              or enrolled[-1]["success"], 60, "the operator enrolling a board on loopback")

        # Through the boards' port, registering a key of one's own is refused, as is listing runs.
        assert not flwr(env, "supernode", "register", f"{rogue}.pub", "board")["success"]
        assert not flwr(env, "ls", "board")["success"]
        assert "refused POST /v1/control" in (tmp_path / "gate.log").read_text()
        nodes = flwr(env, "supernode", "list", "operator")["nodes"]
        assert [str(n["node-id"]) for n in nodes] == [str(enrolled[-1]["node-id"])]  # the rogue's key is not there

        # The enrolled board's SuperNode joins through the gate, its requests signed with its key.
        procs.start("supernode", BIN / "flower-supernode", "--superlink", f"127.0.0.1:{door}",
                    "--root-certificates", certs["ca"], "--auth-supernode-private-key", board,
                    "--port", str(free_port()))
        _wait(lambda: "Activated node_id" in (tmp_path / "superlink.log").read_text(errors="replace"), 180,
              "the enrolled SuperNode activated through the gate")
    finally:
        procs.stop_all()
