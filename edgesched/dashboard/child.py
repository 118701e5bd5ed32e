"""`edgesched simulate --dashboard`: the dashboard as a child process beside the simulation.

A process of its own, not a thread: reading the run directory and serving browsers then
never holds the simulation's interpreter lock, and it is exactly `edgesched dashboard RUN_DIR`.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from edgesched.errors import ConfigError

START_TIMEOUT_S = 20.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port(host: str, wanted: int) -> int:
    """`wanted` if nothing listens there, else a free port the system picks."""
    for port in (wanted, 0):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise ConfigError(f"no free port on {host} for the dashboard")


def _die_with_parent() -> None:
    """In the child, before it runs: on Linux, have the kernel send it SIGTERM when the
    simulation dies, however it dies (a SIGKILL runs no `finally`), so no dashboard outlives
    its run holding the port."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class DashboardProcess:
    """Serve `run_dir` on (host, port) while the `with` block runs; `url` is its address."""

    def __init__(self, run_dir: Path, host: str, port: int) -> None:
        self.run_dir, self.host, self.port = run_dir, host, port
        self.url = f"http://{host}:{port}/"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DashboardProcess:
        errors = tempfile.TemporaryFile()  # not a pipe: nobody reads it while the run goes
        self._process = subprocess.Popen(
            [sys.executable, "-m", "edgesched", "dashboard", str(self.run_dir), "--host", self.host,
             "--port", str(self.port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                errors.seek(0)
                error = errors.read().decode(errors="replace").strip()
                raise ConfigError(f"the dashboard did not start: {error.splitlines()[-1] if error else 'no reason'}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise ConfigError(f"the dashboard did not answer on {self.url} within {START_TIMEOUT_S:.0f} s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
