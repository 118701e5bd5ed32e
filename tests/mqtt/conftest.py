from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.mqtt import BrokerURL, RegistryListener

from .brokers import MOSQUITTO, Embedded, Mosquitto

KEEPALIVE = 2  # seconds: the broker fires a silent agent's Last Will after 1.5 x this


def _need_mosquitto() -> None:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (make test installs it)")


@pytest.fixture(params=["mosquitto", "embedded"])
def broker(request, tmp_path) -> Iterator[Mosquitto | Embedded]:
    if request.param == "mosquitto":
        _need_mosquitto()
        server = Mosquitto(tmp_path)
    else:
        server = Embedded()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def mosquitto_factory(tmp_path) -> Iterator[Callable[..., Mosquitto]]:
    _need_mosquitto()
    started: list[Mosquitto] = []

    def make(conf: str, tls: bool = False) -> Mosquitto:
        server = Mosquitto(tmp_path, conf, tls).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def listen() -> Iterator[Callable[..., RegistryListener]]:
    """Start a gateway-side listener; liveness here comes from status messages only."""
    opened: list[RegistryListener] = []

    def start(url: str, heartbeat_interval: float = 60.0, **kwargs) -> RegistryListener:
        registry = DeviceRegistry(RegistryConfig(heartbeat_interval=heartbeat_interval))
        username, password, ca_file = kwargs.get("username"), kwargs.get("password"), kwargs.get("ca_file")
        listener = RegistryListener(registry, BrokerURL.parse(url, username, password), ca_file=ca_file).__enter__()
        opened.append(listener)
        listener.wait_connected(10)
        return listener

    yield start
    for listener in opened:
        listener.__exit__(None, None, None)


@pytest.fixture
def agents(tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `edgesched agent` as real processes; all are killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(url: str, device_id: str, *extra: str, password: str | None = None) -> subprocess.Popen:
        env = {**os.environ, "EDGESCHED_STATE_DIR": str(tmp_path)}
        if password:
            env["EDGESCHED_MQTT_PASSWORD"] = password
        cmd = [sys.executable, "-m", "edgesched", "agent", "--broker", url, "--device-id", device_id,
               "--interval", "0.3", "--keepalive", str(KEEPALIVE), *extra]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until `predicate` holds; return the seconds it took, or fail naming `what`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {timeout} s")
