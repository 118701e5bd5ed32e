"""docs/deploy.md followed on one machine: a gateway and three boards, each a folder standing for
its machine's `/` (the install scripts' `--root`), set up by the doc's own commands and started
by the command lines of the units the scripts installed there, with their environment files.

Gateway: `deploy/gateway/install.sh --root` (the `edgesched` user, the CA and the gateway's
certificate, every file's owner and mode, gateway.env, Flower's config.toml, the units); each
board enrolled with `make-certs.sh device`, its key registered with `flwr supernode register`,
the broker's files redone with `install.sh --broker-files` and the broker reloaded as its unit
reloads it. Boards: `deploy/device/install.sh --root --bundle` with the bundle the enrolment
made, `LOCAL_DATA=` in device.env and the board's own data.csv there, in the documented layout.
The run: a Flower app in /etc/edgesched/apps/, started by `edgesched-run@`'s command, training
the wine task of examples/ (never part of edgesched). After round 1 one board loses power and
another is slowed to a twentieth of its speed, far below the deadline: the run ends with a model.

What differs from a real host, and why: paths the units name are found under the folder
standing for their machine's `/` and the venv is this checkout's; ports are free ones (the
operator's edit to gateway.env, device.env, config.toml and the broker's `listener`); several
SuperNodes on one host each get `--port` (docs/deploy.md). Mosquitto runs as its unit's user.
The Python services run as root, since this machine's Python (under /root) is not reachable by
other users; instead, the test checks that the unit's user can read every file and write every
folder its command names, which is what the units' `User=edgesched` needs of the install."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.processes import Processes, flower_app
from benchmarks.processes import wait_for as _wait
from edgesched.broker import free_port

from ..mqtt.brokers import MOSQUITTO
from .test_federation_of_processes import assert_ended_with_a_model, rows

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="no mosquitto (make test installs it)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the install scripts make users and set owners: root only")]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent
WINE = REPO / "examples" / "wine"
BOARDS = {"pi-a": 30, "pi-b": 50, "pi-c": 90}  # each board's own wine samples


@dataclass
class Unit:
    user: str
    env: dict[str, str]
    cwd: Path | None
    command: list[str]
    reload: list[str]


class Machine:
    """A machine's files under `root`, as if it were `/`: a path the units or their files name
    is found under root; the venv's programs are this checkout's."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=0o755)

    def path(self, text: str) -> str:
        """`text` with every absolute path of the target machine pointed under root."""
        def where(m: re.Match) -> str:
            found = m.group(1)
            if found == "/opt/edgesched/venv/bin/":
                return f"{BIN}/"
            if found == "/usr/sbin/mosquitto":
                return MOSQUITTO
            return f"{self.root}{found}"
        return re.sub(r"(?<![\w.~-])(/opt/edgesched/venv/bin/|/usr/sbin/mosquitto|/etc/|/var/lib/)", where, text)

    def edit(self, file: str, **lines: str) -> Path:
        """The operator's edit of an installed file (given by its target path): its paths under
        root, and `KEY=value` / `key value` lines replaced; owner and mode kept."""
        path = Path(self.path(file))
        text = self.path(path.read_text())
        for key, value in lines.items():
            text, n = re.subn(rf"(?m)^{key}([= ]).*$", lambda m, k=key, v=value: f"{k}{m.group(1)}{v}", text)
            assert n == 1, f"{file}: no single {key} line"
        st = path.stat()
        path.write_text(text)
        path.chmod(st.st_mode)
        os.chown(path, st.st_uid, st.st_gid)
        return path

    def unit(self, name: str, instance: str = "") -> Unit:
        """An installed unit's user, environment file, working folder and command line, expanded
        as systemd expands them (`${VAR}` within a word, `$VAR` alone splits into words)."""
        text = (self.root / "etc/systemd/system" / name).read_text().replace("\\\n", " ").replace("%i", instance)
        keys: dict[str, str] = {}
        for line in text.splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, value = line.split("=", 1)
                keys.setdefault(key.strip(), value.strip())
        env = _env_file(Path(self.path(keys["EnvironmentFile"]))) if "EnvironmentFile" in keys else {}

        def expand(command: str) -> list[str]:
            words: list[str] = []
            for word in shlex.split(command):
                if re.fullmatch(r"\$(\w+)", word):
                    words += env.get(word[1:], "").split()
                else:
                    words.append(self.path(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word)))
            return words

        cwd = Path(self.path(keys["WorkingDirectory"])) if "WorkingDirectory" in keys else None
        return Unit(keys.get("User", "root"), env, cwd, expand(keys["ExecStart"]), expand(keys.get("ExecReload", "")))

    def start(self, procs: Processes, name: str, unit: Unit, *more: str) -> subprocess.Popen:
        """Start a unit's command. Mosquitto as the unit's user; a Python service as root, once
        the unit's user is shown able to use every file and folder its command names."""
        if unit.user != "root" and Path(unit.command[0]).name != "mosquitto":
            self.assert_usable_by(unit)
            user = None
        else:
            user = unit.user
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(unit.cwd or self.root), "LANG": "C.UTF-8", **unit.env}
        return procs.start(name, *unit.command, *more, user=user, cwd=unit.cwd, **env)

    def assert_usable_by(self, unit: Unit) -> None:
        paths = [Path(p) for w in unit.command for p in re.findall(rf"{re.escape(str(self.root))}[^'\" ]*", w)]
        paths += [Path(v) for v in unit.env.values() if v.startswith(str(self.root))]
        for path in paths:
            if path.exists():
                _can(unit.user, "-r", path)
            else:
                _can(unit.user, "-w", path.parent)  # one it makes (the SuperLink's database)
        if unit.cwd:
            _can(unit.user, "-w", unit.cwd)


def _can(user: str, test: str, path: Path) -> None:
    done = subprocess.run(["test", test, str(path)], user=user, group=pwd.getpwnam(user).pw_gid, extra_groups=[])
    assert done.returncode == 0, f"{user} cannot {'write' if test == '-w' else 'read'} {path}"


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def _sh(*cmd: str | Path) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: {done.stderr}"
    return done.stdout


@pytest.fixture
def bench() -> Iterator[Path]:
    """A folder every user can pass through (pytest's own temp folder is root's alone); the
    `edgesched` user the installs make is removed after, unless it was there before."""
    folder = Path(tempfile.mkdtemp(prefix="edgesched-deploy-", dir="/tmp"))
    folder.chmod(0o755)
    had_user = subprocess.run(["id", "-u", "edgesched"], capture_output=True).returncode == 0
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
    if not had_user:
        subprocess.run(["userdel", "edgesched"], capture_output=True)


def test_the_documented_deployment_trains_boards_on_their_own_data_while_one_dies_and_one_slows(bench):
    gateway = Machine(bench / "gateway")
    procs = Processes(bench, {})
    mqtt, superlink, fleet = free_port(), free_port(), free_port()
    try:
        # 1. The gateway (docs/deploy.md, step 1), its ports moved to free ones.
        _sh("bash", DEPLOY / "gateway" / "install.sh", "--root", gateway.root, "--host", "localhost")
        gateway.edit("/etc/edgesched/gateway.env", SUPERLINK_PORT=str(superlink), FLEET_PORT=str(fleet))
        gateway.edit("/var/lib/edgesched/flwr/config.toml", address=f'= "127.0.0.1:{superlink}"')
        gateway.edit("/etc/mosquitto/conf.d/edgesched/mosquitto.conf", listener=str(mqtt))
        state = Path(gateway.path("/var/lib/mosquitto"))  # the broker unit's StateDirectory=
        state.mkdir(parents=True)
        shutil.chown(state, "mosquitto", "mosquitto")
        broker_unit = gateway.unit("edgesched-mosquitto.service")
        assert broker_unit.user == "mosquitto"
        broker = gateway.start(procs, "mosquitto", broker_unit)
        gateway.start(procs, "superlink", gateway.unit("flower-superlink.service"))
        gateway.start(procs, "gate", gateway.unit("edgesched-fleet-gate.service"))
        run_env = gateway.unit("edgesched-run@.service", "wine").env

        # 2. Each board enrolled on the gateway, its key registered, the broker's files redone.
        certs = Path(gateway.path("/etc/edgesched/certs"))
        flwr = {**os.environ, **run_env}
        for device in BOARDS:
            _sh("bash", DEPLOY / "make-certs.sh", "--dir", certs, "device", device)
            _can("edgesched", "-r", certs / "devices" / device / "supernode.key.pub")  # sudo -u edgesched flwr ...
            _wait(lambda d=device: subprocess.run(
                [BIN / "flwr", "supernode", "register", certs / "devices" / d / "supernode.key.pub"],
                env=flwr, capture_output=True).returncode == 0, 60, f"{device} registered with the SuperLink")
        _sh("bash", DEPLOY / "gateway" / "install.sh", "--root", gateway.root, "--broker-files")
        subprocess.run([*broker_unit.reload, str(broker.pid)], check=True)  # its ExecReload: kill -HUP $MAINPID

        # 3. Each board: its bundle installed, its own data in the documented layout, its units.
        wine = (WINE / "wine.csv").read_text().splitlines()[1:]
        boards, first = {}, 0
        for device, size in BOARDS.items():
            board = boards[device] = Machine(bench / device)
            _sh("bash", DEPLOY / "device" / "install.sh", "--root", board.root, "--board", "generic",
                "--bundle", certs / "devices" / device)
            data = Path(board.path("/var/lib/edgesched/data"))
            data.mkdir()
            (data / "data.csv").write_text("\n".join(wine[first:first + size]) + "\n")
            first += size
            board.edit("/etc/edgesched/device.env", SUPERLINK_PORT=str(fleet), MQTT_PORT=str(mqtt),
                       LOCAL_DATA="/var/lib/edgesched/data", AGENT_ARGS="--interval 1")  # the run's heartbeat-interval
            supernode = board.unit("flower-supernode.service")
            board.start(procs, f"supernode-{device}", supernode, "--port", str(free_port()))
            board.start(procs, f"agent-{device}", board.unit("edgesched-agent.service"))
        _wait(lambda: (bench / "superlink.log").read_text(errors="replace").count("Activated node_id") >= len(BOARDS),
              180, "the boards' SuperNodes admitted")

        # 4. A run (docs/deploy.md, step 4), started by edgesched-run@'s command.
        app = Path(gateway.path("/etc/edgesched/apps/wine"))
        app.mkdir()
        out = Path(gateway.path("/var/lib/edgesched/runs/wine-1"))
        (app / "pyproject.toml").write_text(
            flower_app("wine-run", "edgesched on the documented deployment")
            + f'dataset = "{WINE / "wine_task.py"}:task"\nstrategy = "edgesched"\nclients = {len(BOARDS)}\nrounds = 3\n'
            f'local-epochs = 2\n'
            f'lr = 0.05\nmin-deadline = 30.0\nround-timeout = 120.0\nheartbeat-interval = 1.0\n'
            f'broker = "mqtts://gateway@localhost:{mqtt}"\nbroker-ca-file = "{certs / "ca.crt"}"\n'
            f'out-dir = "{out}"\ncheckpoint-dir = "{gateway.path("/var/lib/edgesched/checkpoints")}"\n')
        run = gateway.start(procs, "flwr-run", gateway.unit("edgesched-run@.service", "wine"))
        _wait(lambda: len(rows(out / "rounds.csv")) >= 1 or run.poll() is not None, 300, "round 1")
        killed_at = time.time()
        procs.kill("supernode-pi-c")
        procs.kill("agent-pi-c")
        slowed = procs.throttle("supernode-pi-b", share=0.05)
        _wait(lambda: run.poll() is not None, 900, "the end of the run")
        slowed.set()
        log = (bench / "flwr-run.log").read_text(errors="replace")
        assert (out / "summary.json").exists() and run.returncode == 0, log[-3000:]  # edgesched submit: completed
    finally:
        procs.stop_all()

    assert_ended_with_a_model(out, 0.7)  # three cultivars: chance is a third
    assert all(f"round {r}: accuracy" in log for r in (1, 2, 3)), log[-3000:]  # the operator follows it
    jobs = rows(out / "jobs.csv")
    assert {j["device_id"] for j in jobs} == set(BOARDS), jobs  # every board trained before the faults
    assert {j["device_id"] for j in jobs if int(j["round"]) >= 2} >= {"pi-a"}
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert not [d for d in decisions if d["kind"] == "outcome" and "refused" in d.get("reason", "")], decisions
    lost = [d for d in decisions if d["kind"] == "outcome" and d["outcome"] == "lost" and d["t"] >= killed_at]
    print("lost after the kill:", [(d["device"], d["reason"], round(d["t"] - killed_at, 1)) for d in lost])
