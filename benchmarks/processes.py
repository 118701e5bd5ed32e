"""Started processes by name, each logging to its own file, waiting for a condition, and the
Flower app a run is submitted as: what a federation of real processes on loopback is made of
(benchmarks.real_fleet, tests/deploy)."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


class Processes:
    """Started processes by name, each in its own session and log file; all stopped at the end."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *cmd: str | Path, user: str | None = None, cwd: Path | None = None,
              **env: str) -> subprocess.Popen:
        """`user`: run as that user, with its own group only (as a systemd unit's `User=`)."""
        log = (self.folder / f"{name}.log").open("wb")
        as_user = {} if user is None else {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
        self.procs[name] = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                                            env={**self.env, **env}, start_new_session=True, cwd=cwd, **as_user)
        return self.procs[name]

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)

    def throttle(self, name: str, share: float, period_s: float = 0.5) -> threading.Event:
        """Slow a started process and every process it starts (a SuperNode's ClientApps) to `share`
        of the time, as cpulimit does: its process group is stopped and continued each `period_s`.
        Returns an event that ends the throttling when set. For a board slowed without root (no
        cgroup quota); its agent, a process of its own, still reports as usual."""
        group, stop = self.procs[name].pid, threading.Event()

        def cycle() -> None:
            try:
                while not stop.is_set() and self.procs[name].poll() is None:
                    os.killpg(group, signal.SIGSTOP)
                    time.sleep(period_s * (1.0 - share))
                    os.killpg(group, signal.SIGCONT)
                    time.sleep(period_s * share)
            except ProcessLookupError:
                pass  # killed meanwhile
            finally:
                if self.procs[name].poll() is None:
                    os.killpg(group, signal.SIGCONT)

        threading.Thread(target=cycle, daemon=True, name=f"throttle-{name}").start()
        return stop

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")


def stop_on_sigterm() -> None:
    """A benchmark ended by `kill` (SIGTERM) stops what it started, as Ctrl-C does: the signal
    becomes SystemExit, so the `finally` that calls `Processes.stop_all` runs. Without it the
    SuperLink, SuperNodes and agents, each in a session of its own, outlive the benchmark."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def flower_app(name: str, description: str) -> str:
    """A Flower app's pyproject.toml that runs edgesched's ServerApp and ClientApp, ending with its
    `[tool.flwr.app.config]` header: the run's settings follow, one `key = value` per line."""
    return f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "{description}"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "edgesched"

[tool.flwr.app.components]
serverapp = "edgesched.server.app:app"
clientapp = "edgesched.clients.app:app"

[tool.flwr.app.config]
"""


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             detail: Callable[[], str] = lambda: "") -> None:
    """Wait until `predicate()` holds; past `timeout`, fail naming `what`, followed by `detail()`
    (e.g. the ends of the logs that tell why it did not happen)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s\n{detail()}".rstrip())
        time.sleep(0.2)
