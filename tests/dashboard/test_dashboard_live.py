"""The dashboard of a running simulation in a real headless browser, its /metrics, and `edgesched
status`; then the finished run replayed, whose metrics must be the run's files' own figures."""

from __future__ import annotations

import csv
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# edgesched_heartbeats_dropped{reason} has no sample until something is dropped
FAMILIES = {"edgesched_run_info", "edgesched_step", "edgesched_devices", "edgesched_heartbeats_accepted",
            "edgesched_jobs_sent", "edgesched_jobs_counted", "edgesched_jobs_failed",
            "edgesched_jobs_late", "edgesched_step_duration_seconds", "edgesched_accuracy", "edgesched_loss",
            "edgesched_bytes"}
FLEET = """
name = "watch-8"
seed = 0
target_accuracy = 0.7

[data]
dataset = "fmnist"
partitioner = "dirichlet"
alpha = 0.5

[training]
rounds = 6
clients_per_round = 3
local_epochs = 1
round_timeout_s = 120.0

[dynamics]
dropout = 0.2
background_load = 0.1

[[devices]]
board = "rpi4"
count = 3
network = "wifi"

[[devices]]
board = "jetson-orin-nano"
count = 2
network = "ethernet"

[[devices]]
board = "phone-mid"
count = 3
network = "mobile"
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _metrics(url: str) -> dict[str, dict[tuple, float]]:
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(family.name, {})[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(metrics, family: str, sample: str | None = None, **labels) -> float:
    return metrics[family][(sample or family, tuple(sorted(labels.items())))]


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def run(tmp_path_factory, fmnist_dir):
    """A short virtual-fleet simulation with its dashboard on, started in the background."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (make test installs them)")
    root = tmp_path_factory.mktemp("watched")
    (root / "watch-8.toml").write_text(FLEET)
    out, log = root / "run", (root / "simulate.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesched", "simulate", "--fleet", str(root / "watch-8.toml"), "--engine",
         "in-process", "--dashboard", "--dashboard-port", str(_free_port()), "--out", str(out)],
        stdout=log, stderr=subprocess.STDOUT)

    def announced():
        log.seek(0)
        found = re.search(r"dashboard: (http://\S+/) ", log.read())
        assert process.poll() is None or found, "the simulation ended before its dashboard started"
        return found and found.group(1)

    url = _wait(announced, 60, "the dashboard's address")
    yield process, url, out, log
    process.kill()
    process.wait()


def test_live_dashboard_shows_the_fleet_and_updates_in_a_real_browser(run, tmp_path):
    _, url, out, _ = run
    browser = _browser()
    try:
        browser.get(url)

        def snapshot():
            return browser.execute_script(
                "const plot = document.getElementById('accuracy');"
                "return {step: Number(document.body.dataset.step || 0), status: document.body.dataset.status,"
                " rows: document.querySelectorAll('#devices tbody tr').length,"
                " points: plot.data ? plot.data[0].x.length : 0,"
                " states: [...document.querySelectorAll('#devices tbody .state')].map(e => e.textContent)};")

        first = _wait(lambda: (s := snapshot())["rows"] == 8 and s["points"] >= 1 and s, 180,
                      "device rows and an accuracy point")
        assert first["status"] == "running", "the run finished before the browser saw it running"
        assert set(first["states"]) <= {"training", "online", "stale", "offline"}

        during = _metrics(url)  # Prometheus, while the run goes
        assert set(during) >= FAMILIES, FAMILIES - set(during)
        assert sum(during["edgesched_devices"].values()) == 8
        assert _value(during, "edgesched_run_info", run="run", strategy="edgesched", fleet="watch-8",
                      status="running") == 1
        status = subprocess.run([sys.executable, "-m", "edgesched", "status", str(out)], capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and "running" in status.stdout and "rpi4-0000" in status.stdout

        second = _wait(lambda: (s := snapshot())["step"] > first["step"] and s, 180, "the next step on the page")
        assert second["points"] > first["points"] and second["rows"] == 8
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 20_000
    finally:
        browser.quit()


def test_finished_run_replays_with_the_figures_of_its_files(run):
    process, _, out, log = run
    assert process.wait(timeout=600) == 0, log.seek(0) or log.read()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    with (out / "jobs.csv").open() as f:
        jobs = list(csv.DictReader(f))
    with (out / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    port = _free_port()
    replay = subprocess.Popen([sys.executable, "-m", "edgesched", "dashboard", str(out), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    try:
        metrics = _wait(lambda: _try_metrics(url), 30, "the replayed run's metrics")
    finally:
        replay.terminate()
        replay.wait(timeout=10)
    assert _value(metrics, "edgesched_run_info", run="run", strategy="edgesched", fleet="watch-8",
                  status="finished") == 1
    assert _value(metrics, "edgesched_step") == summary["rounds"] == len(rounds)
    assert _value(metrics, "edgesched_jobs_counted", "edgesched_jobs_counted_total") == len(jobs)
    sent = sum(int(r["selected"]) for r in rounds)
    assert _value(metrics, "edgesched_jobs_sent", "edgesched_jobs_sent_total") == sent
    assert _value(metrics, "edgesched_jobs_failed", "edgesched_jobs_failed_total") == summary["failed_jobs"]
    assert _value(metrics, "edgesched_accuracy") == pytest.approx(summary["final_accuracy"])
    dropped = sum(metrics.get("edgesched_heartbeats_dropped", {}).values())
    assert dropped == sum(summary["telemetry_dropped"].values())
    assert sum(metrics["edgesched_devices"].values()) == summary["clients"] == 8
    assert _value(metrics, "edgesched_bytes", "edgesched_bytes_total", direction="down") == summary["bytes_down"]
    assert _value(metrics, "edgesched_step_duration_seconds", "edgesched_step_duration_seconds_count",
                  clock="virtual") == len(rounds)

    status = subprocess.run([sys.executable, "-m", "edgesched", "status", str(out), "--devices", "3"],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "finished" in status.stdout and "and 5 more" in status.stdout


def _try_metrics(url: str):
    try:
        return _metrics(url)
    except OSError:
        return None


def test_dashboard_of_no_run_directory_is_one_line(tmp_path):
    (tmp_path / "stray.txt").write_text("not a run")
    for target, says in ((tmp_path / "missing", "no such run directory"), (tmp_path, "not a run directory")):
        done = subprocess.run([sys.executable, "-m", "edgesched", "dashboard", str(target)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_killed_simulation_takes_its_dashboard_with_it(tmp_path, fmnist_dir):
    """SIGKILL runs no clean-up in the simulation: the kernel ends its dashboard, freeing the port."""
    (tmp_path / "watch-8.toml").write_text(FLEET)
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesched", "simulate", "--fleet", str(tmp_path / "watch-8.toml"), "--engine",
         "in-process", "--dashboard", "--dashboard-port", str(port), "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert f"dashboard: http://127.0.0.1:{port}/" in process.stdout.readline()
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it serves
        process.kill()
        process.wait()

        def closed():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return True
            return False

        _wait(closed, 15, "the orphaned dashboard to exit")
    finally:
        process.kill()
