"""A fleet simulation on a two-node Ray cluster (both nodes on this machine, on loopback): the
executors spread over the nodes, and the run is byte for byte the one trained in this process."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
RAY = shutil.which("ray", path=str(Path(sys.executable).parent))  # the venv's, beside this Python
# Each node's free CPUs, twice a second, as a driver on the cluster sees them.
POLL = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
from ray._private.state import available_resources_per_node
while True:
    print(json.dumps({n: r.get("CPU", 0.0) for n, r in available_resources_per_node().items()}), flush=True)
    time.sleep(0.5)
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray(*args: str) -> None:
    done = subprocess.run([RAY, *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture
def cluster():
    """A head and a worker node of one CPU each. `ray stop` at the end stops every Ray of this
    machine: the test suite runs nothing else on Ray meanwhile."""
    if RAY is None:
        pytest.skip("the ray command is not installed")
    address = f"127.0.0.1:{_port()}"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory", str(300 * 2**20),
              "--disable-usage-stats"]
    try:
        _ray("start", "--head", "--port", address.split(":")[1], "--include-dashboard", "false", *common)
        _ray("start", "--address", address, *common)
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def _simulate(out, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "edgesched", "simulate", "--fleet", "lab-20", "--rounds", "2",
                           "--dropout", "0.3", "--out", str(out), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_two_node_cluster_trains_the_same_run_as_one_process(cluster, tmp_path, fmnist_dir):
    poll = subprocess.Popen([sys.executable, "-c", POLL, cluster], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        _simulate(tmp_path / "cluster", "--ray-address", cluster)
    finally:
        poll.kill()
    seen = [json.loads(line) for line in poll.stdout.read().splitlines() if line.startswith("{")]
    assert seen and len(seen[0]) == 2  # two nodes
    assert any(len(cpus) == 2 and all(free == 0 for free in cpus.values()) for cpus in seen), \
        "the executors never held both nodes' CPUs at once"

    _simulate(tmp_path / "here", "--engine", "in-process")
    for name in ("model.npz", "events.jsonl", "decisions.jsonl", "jobs.csv"):
        assert (tmp_path / "cluster" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name


def test_a_cluster_that_is_not_there_is_one_line(tmp_path, fmnist_dir):
    done = subprocess.run([sys.executable, "-m", "edgesched", "simulate", "--fleet", "lab-20", "--rounds", "1",
                           "--ray-address", f"127.0.0.1:{_port()}", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("edgesched: error: cannot join the Ray cluster at 127.0.0.1:")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
