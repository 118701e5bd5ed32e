"""Benchmark: what watching a simulation costs it.

Runs the same fleet simulation (same seed: the same training, byte for byte) with and without
`--dashboard`, in the order A B B A so that a machine slowing down or warming up weighs on
both alike. While the dashboard is on, a real headless browser keeps the page open (its
server-sent updates flow) and /metrics is scraped every 5 s, as Prometheus would. Prints each
run's wall time and the ratio of the totals.

    python -m benchmarks.dashboard_overhead --fleet mixed-24
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def _watch(log: Path, stop: threading.Event) -> None:
    """Open the dashboard in headless chromium once it is announced; scrape /metrics every 5 s."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    url = None
    while url is None and not stop.is_set():
        found = re.search(r"dashboard: (http://\S+/) ", log.read_text())
        url = found and found.group(1)
        time.sleep(0.2)
    if url is None:
        return
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        browser.get(url)
        while not stop.wait(5.0):
            try:
                urllib.request.urlopen(url + "metrics", timeout=5).read()
            except OSError:
                break
    finally:
        browser.quit()


def run(fleet: str, rounds: int | None, dashboard: bool, folder: Path) -> float:
    out = folder / f"run-{time.monotonic_ns()}"
    log = folder / f"{out.name}.log"
    command = [sys.executable, "-m", "edgesched", "simulate", "--fleet", fleet, "--out", str(out)]
    command += ["--rounds", str(rounds)] if rounds else []
    command += ["--dashboard"] if dashboard else []
    stop = threading.Event()
    with log.open("w") as sink:
        begun = time.monotonic()
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=_watch, args=(log, stop), daemon=True)
        if dashboard:
            watcher.start()
        code = process.wait()
        seconds = time.monotonic() - begun
    stop.set()
    if dashboard:
        watcher.join(timeout=30)
    if code != 0:
        sys.exit(f"the simulation failed: see {log}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", default="mixed-24")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for dashboard in (False, True, True, False):
            seconds = run(args.fleet, args.rounds, dashboard, Path(tmp))
            times[dashboard].append(seconds)
            print(f"{'with' if dashboard else 'without'} dashboard: {seconds:.1f} s", flush=True)
    ratio = sum(times[True]) / sum(times[False])
    print(f"with / without: {ratio:.3f} ({100 * (ratio - 1):+.1f} %)")


if __name__ == "__main__":
    main()
