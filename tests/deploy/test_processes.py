"""The benchmarks' process harness: a benchmark stopped with `kill` leaves nothing running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

BENCHMARK = """
import os, sys, time
from pathlib import Path
from benchmarks.processes import Processes, stop_on_sigterm
stop_on_sigterm()
procs = Processes(Path(sys.argv[1]), {"PATH": os.environ["PATH"]})
try:
    print(procs.start("board", "sleep", "300").pid, flush=True)
    time.sleep(300)
finally:
    procs.stop_all()
"""


def test_a_benchmark_stopped_with_sigterm_stops_the_processes_it_started(tmp_path):
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                             text=True)
    board = int(bench.stdout.readline())  # in a session of its own: a signal to the benchmark alone misses it
    try:
        assert psutil.pid_exists(board)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 128 + signal.SIGTERM
        assert not psutil.pid_exists(board)
    finally:
        bench.kill()
        if psutil.pid_exists(board):
            os.kill(board, signal.SIGKILL)
