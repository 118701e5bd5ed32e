"""Submit a Flower run and follow it to its end, stopping it on the SuperLink if we are stopped.

`flwr run --stream` only follows a run: stopped (Ctrl-C, or systemd stopping
`edgesched-run@NAME`), it leaves the run going on the SuperLink, out of the operator's sight.
This starts the run with `flwr run --format json` for its id, follows `flwr log --stream` (it
ends with the run; it is followed again if it ends while the run goes on), and on SIGTERM or
SIGINT asks `flwr stop` to end the run. The exit code says how the run ended.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from edgesched.errors import EdgeschedError

FOLLOW_AGAIN_S = 2.0  # pause before following again a log stream that ended while the run goes on
STOP_WAIT_S = 30.0  # how long a stopped run may take to say it has finished


def _flwr() -> str:
    beside = Path(sys.executable).parent / "flwr"
    return str(beside) if beside.exists() else shutil.which("flwr") or "flwr"


def _json(*args: str) -> dict:
    """`flwr ARGS --format json`: its answer, or an error with flwr's last line."""
    try:
        done = subprocess.run([_flwr(), *args, "--format", "json"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EdgeschedError(f"flwr {args[0]}: {exc}") from None
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        answer = {"success": False, "error-message": (done.stderr or done.stdout or "no answer").strip()}
    if not answer.get("success"):
        lines = [line for line in str(answer.get("error-message", "")).splitlines() if line.strip()]
        raise EdgeschedError(f"flwr {args[0]}: {lines[-1] if lines else 'failed'}")
    return answer


def status(run_id: str, superlink: list[str]) -> str:
    runs = _json("ls", *superlink, "--run-id", run_id).get("runs", [])
    return str(runs[0].get("status", "unknown")) if runs else "unknown"


def submit(app: Path, superlink: str | None = None) -> str:
    """Run the Flower app at `app`, following its log; returns how it ended (Flower's status:
    `finished:completed`, or `finished:stopped` when stopped from here). A run that failed, or
    was stopped from elsewhere, is an error."""
    if not (app / "pyproject.toml").is_file():
        raise EdgeschedError(f"{app}: not a Flower app (no pyproject.toml)")
    where = [superlink] if superlink else []
    run_id = str(_json("run", str(app), *where)["run-id"])
    print(f"run {run_id} started; stopping this stops the run", flush=True)
    stopping: list[int] = []
    follower: subprocess.Popen | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        if follower is not None and follower.poll() is None:
            follower.terminate()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping:
            follower = subprocess.Popen([_flwr(), "log", run_id, *where, "--stream"])
            follower.wait()
            if stopping or status(run_id, where).startswith("finished"):
                break
            time.sleep(FOLLOW_AGAIN_S)
        if stopping and not status(run_id, where).startswith("finished"):
            _json("stop", run_id, *where)
            print(f"run {run_id}: stopped on the SuperLink", flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    deadline = time.monotonic() + STOP_WAIT_S
    while not (ended := status(run_id, where)).startswith("finished") and time.monotonic() < deadline:
        time.sleep(0.5)
    if ended != "finished:completed" and not (stopping and ended == "finished:stopped"):
        raise EdgeschedError(f"run {run_id} ended {ended}")
    return ended
