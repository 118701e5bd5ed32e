"""A real federation on loopback: Mosquitto with TLS, Flower's SuperLink with TLS and SuperNode
authentication behind the fleet gate (as deploy/gateway's units run them), the edgesched
ServerApp, SuperNodes enrolled with their own keys, and device agents, each its own process.

With four boards: one device's SuperNode and agent are killed mid-run: its Last Will reaches
the gateway through MQTT, its job is dropped within seconds (Flower alone notices a dead
SuperNode after about a minute), and the run goes on. Then the broker is down for 10 s during
round 2: the gateway keeps scheduling on what it last heard, and both sides reconnect. Then
the gateway loses power in round 3: the SuperLink and the ServerApp are SIGKILLed. The
SuperLink restarts on its database, the boards reconnect under their node ids, the run is
submitted again and goes on from its last checkpoint, never planning the dead board (its node
is remembered in the checkpoint), and it ends with a model and every round recorded once.

With ten boards: three, chosen at random, lose power at random moments during the rounds,
and the run completes on the other seven."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from benchmarks.processes import Processes, flower_app
from benchmarks.processes import wait_for as _wait
from edgesched.broker import free_port
from edgesched.core.compress import ADAPTIVE_BITS
from edgesched.tasks import model_size
from edgesched.trace import load_trace

from ..mqtt.brokers import MOSQUITTO, Mosquitto, password_file, shipped_config, wait_for_port

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
# A board silent for 2.5 heartbeats is offline. At 0.5 s, an agent starved of CPU for 1.25 s (a
# ClientApp importing torch beside two busy benchmark processes on two cores) was taken for dead
# while it lived, and its job dropped before the kill this test makes; a dead board's Last Will
# comes within a second whatever the interval.
HEARTBEAT_S = 1.0
APP = flower_app("edgesched-e2e", "edgesched on a loopback federation") + f"""strategy = "edgesched"
rounds = 3
min-deadline = 30.0
round-timeout = 120.0
heartbeat-interval = {HEARTBEAT_S}
compression = "adaptive"
"""


# The shards are IID: these tests are about faults, not label skew. On Dirichlet(0.3) shards, three
# rounds of a few updates each ended anywhere from 19 % to 67 % accuracy, depending on which
# boards died when.


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # ended meanwhile, or a zombie
        return ""


def rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


class Federation:
    """Mosquitto (the shipped TLS, password and ACL config), a SuperLink, and one SuperNode and
    one agent per device; `submit` runs the edgesched ServerApp on it with `flwr run`."""

    def __init__(self, folder: Path, devices: list[str], fraction_train: float) -> None:
        self.folder, self.devices, self.out = folder, devices, folder / "run"
        self.node_ids: dict[str, int] = {}
        password_file(folder, {"gateway": "gw-secret", **{d: f"{d}-secret" for d in devices}})
        self.broker = Mosquitto(folder, shipped_config(folder), tls=True)
        self.link, self.door, home = free_port(), free_port(), folder / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.link}"\n'
                                          f'root-certificates = "{folder / "ca.crt"}"\n')
        (folder / "app").mkdir()
        self.procs = Processes(folder, {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                                        "PATH": f"{BIN}:{os.environ['PATH']}"})
        self.app = (f'{APP}dataset = "digits"\npartitioner = "iid"\n'
                    f"clients = {len(devices)}\nfraction-train = {fraction_train}\n"
                    f"broker = 'mqtts://gateway@localhost:{self.broker.port}'\nbroker-ca-file = '{folder / 'ca.crt'}'\n"
                    f"out-dir = '{self.out}'\ncheckpoint-dir = '{folder / 'checkpoints'}'\n")

    def __enter__(self) -> Federation:
        self.broker.start()
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def start_superlink(self, name: str = "superlink") -> None:
        """The gateway's certificate serves the broker and the SuperLink, as on a real gateway; the
        database keeps enrolled keys and node ids across the SuperLink's restarts."""
        self.procs.start(name, BIN / "flower-superlink", "--ssl-certfile", self.folder / "server.crt",
                         "--ssl-keyfile", self.folder / "server.key", "--ssl-ca-certfile", self.folder / "ca.crt",
                         "--enable-supernode-auth", "--database", self.folder / "superlink.db",
                         "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port",
                         str(self.link), EDGESCHED_MQTT_PASSWORD="gw-secret")

    def _start(self) -> None:
        self.start_superlink()
        self.procs.start("gate", sys.executable, "-m", "edgesched", "gate", "--listen", f"127.0.0.1:{self.door}",
                         "--superlink", f"https://127.0.0.1:{self.link}", "--ca-file", self.folder / "ca.crt",
                         "--certfile", self.folder / "server.crt", "--keyfile", self.folder / "server.key")
        # A SuperNode whose TLS handshake fails gives up and exits (a board's unit restarts it; here
        # nothing would): it connects only once the gate listens.
        wait_for_port(self.door, timeout=60)
        for device in self.devices:
            self.node_ids[device] = self.enrol(device)
            state = self.folder / f"state-{device}"  # where the ClientApp leaves job speeds for the agent
            self.start_supernode(device, "--node-config", f"device-id='{device}'",
                                 EDGESCHED_STATE_DIR=str(state))
            self.procs.start(f"agent-{device}", sys.executable, "-m", "edgesched", "agent", "--broker",
                             self.broker.url, "--device-id", device, "--username", device, "--ca-file",
                             self.folder / "ca.crt", "--interval", str(HEARTBEAT_S), "--keepalive", "2",
                             EDGESCHED_STATE_DIR=str(state), EDGESCHED_MQTT_PASSWORD=f"{device}-secret")
        (self.folder / "app" / "pyproject.toml").write_text(self.app)
        _wait(self.all_activated, 180, f"{len(self.devices)} SuperNodes registered", self.startup_report)

    def joining(self) -> list[str]:
        """The processes a SuperNode's registration goes through: the gate, then each SuperNode."""
        return ["gate", *(f"supernode-{d}" for d in self.devices)]

    def all_activated(self) -> bool:
        """Every SuperNode activated on the SuperLink; fails at once if one of them, or the gate
        they connect through, has exited (a SuperNode gives up on a TLS error)."""
        for name in self.joining():
            if self.procs.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited before every SuperNode registered\n{self.startup_report()}")
        return self.log("superlink").count("Activated node_id") >= len(self.devices)

    def startup_report(self) -> str:
        """The ends of the gate's and each SuperNode's logs: why a SuperNode did not register."""
        return "\n".join(f"--- {name}:\n{self.log(name)[-1500:]}" for name in self.joining())

    def __exit__(self, *exc: object) -> None:
        self.procs.stop_all()
        self.broker.stop()

    def key(self, device: str) -> Path:
        """A board's SuperNode key pair, made as deploy/make-certs.sh makes it."""
        key = self.folder / f"{device}.key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(key)], check=True)
        return key

    def enrol(self, device: str) -> int:
        """Register the board's public key with the SuperLink (`flwr supernode register`), retried
        while the SuperLink starts; returns the node id the SuperLink gives it."""
        key, answers = f"{self.key(device)}.pub", []
        _wait(lambda: answers.append(self.flwr("supernode", "register", key)) or answers[-1], 60, f"{device} enrolled")
        return int(answers[-1]["node-id"])

    def flwr(self, *args: str) -> dict | None:
        """`flwr ARGS` against this SuperLink; its JSON answer, or None while the SuperLink is not
        up (then flwr answers {"success": false, ...})."""
        done = subprocess.run([BIN / "flwr", *args, "local", "--format", "json"], capture_output=True, text=True,
                              env=self.procs.env)
        answer = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
        return answer if answer.get("success") else None

    def start_supernode(self, device: str, *args: str, **env: str) -> subprocess.Popen:
        return self.procs.start(f"supernode-{device}", BIN / "flower-supernode", "--superlink",
                                f"127.0.0.1:{self.door}", "--root-certificates", self.folder / "ca.crt",
                                "--auth-supernode-private-key", self.folder / f"{device}.key",
                                "--port", str(free_port()), *args, **env)

    def submit(self, name: str = "flwr-run") -> subprocess.Popen:
        """`edgesched submit`, as the gateway's edgesched-run@ unit runs it: it follows the run to
        its end on the SuperLink (a `flwr run --stream` log once ended while the run went on) and
        names how a run that failed ended."""
        return self.procs.start(name, sys.executable, "-m", "edgesched", "submit", self.folder / "app", "local")

    def report(self, name: str) -> str:
        """For a failed run: the end of its submitter's log and what the SuperLink said of it."""
        link = [line for line in self.log("superlink").splitlines() if "uvicorn.access" not in line
                and "[Fleet." not in line]
        return "\n".join([self.log(name)[-3000:], "--- superlink:", *link[-25:]])

    def power_off(self, device: str) -> float:
        """The board dies: its SuperNode (with any ClientApp it started) and its agent, SIGKILLed;
        returns the moment it died (before the kills: the Last Will may be in within milliseconds)."""
        died_at = time.time()
        self.procs.kill(f"supernode-{device}")
        self.procs.kill(f"agent-{device}")
        return died_at

    def rounds(self) -> list[dict[str, str]]:
        return rows(self.out / "rounds.csv")

    def node(self, device: str) -> str:
        """The name the gateway's decision log gives a device: its SuperNode's id, the one its
        key was given at enrolment (so it stays the same across restarts)."""
        node_id = int(re.search(r"SuperNode ID: (\d+)", self.log(f"supernode-{device}")).group(1))
        assert node_id == self.node_ids[device]
        return f"node-{node_id}"

    def assert_unenrolled_board_refused(self) -> None:
        """A SuperNode whose key was never registered is turned away by the SuperLink."""
        self.key("rogue")
        rogue = self.start_supernode("rogue", "--max-retries", "1", "--node-config", "device-id='rogue'")
        _wait(lambda: "No SuperNode found with the given public key" in self.log("superlink"), 60,
              "the SuperLink refusing the unenrolled SuperNode")
        assert "SuperNode ID" not in self.log("supernode-rogue")
        if rogue.poll() is None:
            self.procs.kill("supernode-rogue")

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def assert_dropped_through_mqtt(self, device: str, killed_at: float) -> int:
        """A dead board's jobs are dropped within seconds (reason: offline) and it is never planned
        again; returns how many of its jobs were in flight."""
        decisions = [json.loads(line) for line in (self.out / "decisions.jsonl").read_text().splitlines()]
        node = self.node(device)
        dropped = [d for d in decisions if d["kind"] == "outcome" and d.get("device") == node
                   and d["outcome"] == "lost" and d["t"] >= killed_at]
        planned_after = [d for d in decisions if d["kind"] == "plan" and d.get("selected")
                         and d["device"] == node and d["t"] > killed_at + 5]
        print(f"{device}: " + ", ".join(f"job dropped {d['t'] - killed_at:.1f} s after the kill" for d in dropped)
              if dropped else f"{device}: no job in flight")
        for d in decisions:  # its story, for the log of a failed run
            if d.get("device") == node and d["kind"] in ("plan", "outcome") and (d["kind"] != "plan" or d["selected"]):
                print(f"  {d['t'] - killed_at:+8.1f} s round {d['round']} {d['kind']} "
                      f"{d.get('outcome', '')} {d.get('reason', '')}")
        assert all(d["t"] - killed_at < 10 and d["reason"] == "device offline" for d in dropped), dropped
        assert not planned_after, planned_after  # offline through its Last Will: never planned again
        return len(dropped)


def assert_ended_with_a_model(out: Path, accuracy: float = 0.6) -> None:
    """The run in `out` recorded rounds 1-3 once each, above `accuracy` (ten digits on IID shards:
    chance is 0.1, three rounds ~0.9), with an update in its last, and wrote its model."""
    rounds = rows(out / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [1, 2, 3], rounds
    assert float(rounds[-1]["accuracy"]) > accuracy, rounds
    print(f"final accuracy {float(rounds[-1]['accuracy']):.2%} after rounds 1-3")
    assert int(rounds[-1]["replied"]) >= 1
    assert (out / "model.npz").stat().st_size > 0


def assert_compressed(out: Path) -> None:
    """Every job of the run in `out` went both ways compressed (the APP's `compression`): each
    update in its job's adaptive width, each download an 8-bit difference."""
    float32 = 4 * model_size("digits")["model_parameters"]
    jobs = rows(out / "jobs.csv")
    assert jobs and all(int(j["bits"]) in ADAPTIVE_BITS for j in jobs), jobs
    assert all(0 < int(j["bytes_up"]) < float32 / 3 and 0 < int(j["bytes_down"]) < float32 / 3 for j in jobs), jobs
    print("update widths:", sorted(int(j["bits"]) for j in jobs))


@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto is not installed (make test installs it)")
def test_a_device_killed_mid_run_is_dropped_through_mqtt_and_the_run_ends_with_a_model(tmp_path):
    with Federation(tmp_path, ["pi-a", "pi-b", "pi-c", "pi-d"], fraction_train=0.75) as fed:
        fed.assert_unenrolled_board_refused()
        run = fed.submit()
        victim = "pi-d"  # dies as its first job reaches it: the job is in flight
        _wait(lambda: "Receiving: train message" in fed.log(f"supernode-{victim}") or run.poll() is not None,
              300, "the first job reaching the victim")
        killed_at = fed.power_off(victim)
        _wait(lambda: len(fed.rounds()) >= 1 or run.poll() is not None, 300, "round 1 without the victim")
        fed.broker.restart(down_seconds=10.0)  # round 2 is under way meanwhile
        _wait(lambda: len(fed.rounds()) >= 2 or run.poll() is not None, 300, "round 2")
        # The gateway loses power mid-round 3: the SuperLink and the ServerApp that Flower's
        # SuperExec started for the run (a process of its own, pointed at this SuperLink) die.
        server_apps = [p for p in psutil.process_iter() if "flwr-serverapp" in (c := _cmdline(p))
                       and f":{fed.link}" in c]
        assert server_apps and run.poll() is None
        fed.procs.kill("superlink")
        for server_app in server_apps:
            if server_app.is_running():
                server_app.kill()
        _wait(lambda: run.poll() is not None, 120, "the stopped run's log to end")
        # Restarted on its database, the SuperLink lists the dead board's node again until Flower's
        # heartbeat times it out: the resumed gateway must know that node from its checkpoint.
        fed.start_superlink("superlink-rebooted")  # the live boards reconnect under their node ids
        _wait(lambda: fed.flwr("supernode", "list") is not None, 60, "the rebooted SuperLink answering")
        again = fed.submit("flwr-run-again")
        _wait(lambda: again.poll() is not None, 600, "the end of the resumed run")
        assert (fed.out / "summary.json").exists(), fed.report("flwr-run-again")
    assert_ended_with_a_model(fed.out)  # trained on after the outage and the server's restart
    assert_compressed(fed.out)
    assert fed.assert_dropped_through_mqtt(victim, killed_at) == 1  # its job, dropped within seconds


@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto is not installed (make test installs it)")
def test_thirty_percent_of_the_boards_die_at_random_during_rounds_and_the_run_completes(tmp_path):
    devices = [f"pi-{i}" for i in range(10)]
    rng = np.random.default_rng(8)
    victims = [str(d) for d in rng.choice(devices, size=3, replace=False)]
    # Moments after the first job reaches a board; rounds take about 15-30 s here.
    moments = np.sort(rng.uniform(0.0, 40.0, size=3))
    print("power off:", ", ".join(f"{v} at +{m:.1f} s" for v, m in zip(victims, moments, strict=True)))
    killed: dict[str, float] = {}
    with Federation(tmp_path, devices, fraction_train=0.5) as fed:
        run = fed.submit()
        _wait(lambda: any("Receiving: train message" in fed.log(f"supernode-{d}") for d in devices)
              or run.poll() is not None, 300, "the first job reaching a board")
        started = time.monotonic()
        for victim, moment in zip(victims, moments, strict=True):
            time.sleep(max(0.0, started + moment - time.monotonic()))
            assert run.poll() is None and len(fed.rounds()) < 3, "the run ended before the kills"
            killed[victim] = fed.power_off(victim)
        _wait(lambda: run.poll() is not None, 600, "the end of the run")
        assert (fed.out / "summary.json").exists() and run.returncode == 0, fed.report("flwr-run")
    # The operator follows the run: a line per round reaches its log.
    assert all(f"round {r}: accuracy" in fed.log("flwr-run") for r in (1, 2, 3)), fed.log("flwr-run")[-3000:]
    assert_ended_with_a_model(fed.out)
    assert_compressed(fed.out)
    in_flight = sum(fed.assert_dropped_through_mqtt(v, t) for v, t in killed.items())
    print(f"{in_flight} jobs were in flight on the boards that died")
    assert_traced(fed.out / "trace.csv", devices, killed)


def assert_traced(path: Path, devices: list[str], killed: dict[str, float]) -> None:
    """The gateway's trace.csv has every board, the dead ones gone within seconds of their death
    and the others online to the end, every piece with a speed learned from a job."""
    noted = re.search(r"0 s is Unix time ([0-9.]+)", path.read_text())
    assert noted, path.read_text()[:200]
    origin = float(noted[1])
    trace = load_trace(path)
    traced = {d.device: d for d in trace.devices}
    assert set(traced) == set(devices), sorted(traced)
    for device, died_at in killed.items():
        gone = origin + traced[device].intervals[-1].end_s
        assert 0 <= gone - died_at < 15, (device, gone - died_at)
    assert all(traced[d].intervals[-1].end_s == trace.period_s for d in devices if d not in killed)
    print("traced:", {d: (round(t.online_share(), 3), round(t.median_speed(), 3)) for d, t in traced.items()})
