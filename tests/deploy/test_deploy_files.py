"""The deployment files: systemd units that systemd accepts, scripts that shellcheck accepts, an
install script whose dry run passes here, and a device enrolled end to end with make-certs.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from edgesched.broker import free_port
from edgesched.core.registry import DeviceRegistry, RegistryConfig
from edgesched.mqtt import BrokerURL, RegistryListener

from ..mqtt.brokers import DEPLOY as MOSQUITTO_CONF
from ..mqtt.brokers import MOSQUITTO, Mosquitto, wait_for_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCRIPTS = sorted(DEPLOY.rglob("*.sh"))
VENV_BIN = Path(sys.executable).parent


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
@pytest.mark.parametrize("host", ["gateway", "device"])
def test_systemd_finds_no_bad_setting_in_any_unit(host, tmp_path):
    units = sorted((DEPLOY / host).glob("*.service"))
    if any("/usr/sbin/mosquitto" in u.read_text() for u in units) and not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    copies = []
    for unit in units:  # installed, they run edgesched from /opt/edgesched/venv; here, from this venv
        copy = tmp_path / unit.name.replace("@.", "@lab.")
        copy.write_text(unit.read_text().replace("/opt/edgesched/venv/bin", str(VENV_BIN)))
        copies.append(str(copy))
    done = subprocess.run(["systemd-analyze", "verify", *copies], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", sorted(DEPLOY.rglob("*.service")), ids=lambda u: u.name)
def test_every_unit_is_sandboxed(unit):
    """systemd's own rating of a unit's exposure: at most 5 ("MEDIUM"); the stock rating of a unit
    with only a user and ProtectSystem is 8.7, "EXPOSED"."""
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=50", str(unit)],  # tenths
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr
    rating = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout).group(1))
    assert rating <= 5.0


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed (make test installs it)")
def test_shellcheck_is_clean_on_every_script():
    done = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_the_install_scripts_dry_run_passes_here_and_says_what_it_would_do():
    install = DEPLOY / "device" / "install.sh"
    done = subprocess.run(["bash", str(install), "--dry-run", "--board", "rpi"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install torch==2.13.0" in done.stdout
    assert "systemctl enable --now flower-supernode.service edgesched-agent.service" in done.stdout
    jetson = subprocess.run(["bash", str(install), "--dry-run", "--board", "jetson"], capture_output=True, text=True,
                            timeout=60)
    assert jetson.returncode == 1 and "needs --torch-index" in jetson.stderr


def test_the_gateway_install_gives_each_unprivileged_user_the_files_it_reads():
    done = subprocess.run(["bash", str(DEPLOY / "gateway" / "install.sh"), "--dry-run", "--host", "gw.local"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "systemctl disable --now mosquitto.service" in said  # it would hold the broker's port
    if subprocess.run(["id", "-u", "edgesched"], capture_output=True).returncode != 0:
        assert "useradd --system --home-dir /var/lib/edgesched" in said
    assert "make-certs.sh --dir /etc/edgesched/certs gateway gw.local" in said
    # Mosquitto reads its key and passwords as `mosquitto`; the SuperLink its key as `edgesched`.
    for secret in ("server.key", "passwords"):
        assert re.search(rf"install -m 0640 -o root -g mosquitto \S+ /etc/mosquitto/conf.d/edgesched/{secret}", said)
    assert "chgrp edgesched /etc/edgesched/certs /etc/edgesched/certs/gateway.key" in said
    assert 'root-certificates = "/etc/edgesched/certs/ca.crt"' in said  # flwr finds the SuperLink
    assert said.index("systemctl daemon-reload") < said.index("systemctl enable --now edgesched-mosquitto.service")


@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto is not installed (make test installs it)")
def test_make_certs_enrols_a_device_that_the_shipped_broker_then_admits(tmp_path):
    certs = tmp_path / "certs"
    script = DEPLOY / "make-certs.sh"
    for args in (["ca"], ["gateway", "localhost"], ["device", "pi-07"]):
        done = subprocess.run(["bash", str(script), "--dir", str(certs), *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
    again = subprocess.run(["bash", str(script), "--dir", str(certs), "device", "pi-07"], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "already enrolled" in again.stderr
    gateway_login = (certs / "passwords").read_text()
    for bad, says in (("gateway", "is the gateway's broker login"), ("--", "starting with a letter or digit"),
                      ("-pi", "starting with a letter or digit"), ("pi/07", "use 1-64 letters")):
        refused = subprocess.run(["bash", str(script), "--dir", str(certs), "device", bad], capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode != 0 and says in refused.stderr, (bad, refused.stderr)
    assert (certs / "passwords").read_text() == gateway_login  # nobody's password was replaced
    bundle = certs / "devices" / "pi-07"
    key = load_ssh_private_key((bundle / "supernode.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)  # what flower-supernode --auth-supernode-private-key takes
    env = dict(line.split("=", 1) for line in (bundle / "device.env").read_text().splitlines())
    assert env["DEVICE_ID"] == "pi-07" and env["GATEWAY"] == "localhost"

    # The shipped Mosquitto config with these certificates and logins admits the enrolled board.
    conf = (MOSQUITTO_CONF / "mosquitto.conf").read_text().replace("/etc/mosquitto/conf.d/edgesched/", f"{certs}/")
    conf = conf.replace(f"{certs}/server.", f"{certs}/gateway.").replace(f"{certs}/edgesched.acl",
                                                                           str(MOSQUITTO_CONF / "edgesched.acl"))
    keep = "\n".join(line for line in conf.splitlines() if not line.startswith(("listener ", "persistence")))
    broker = Mosquitto(tmp_path, keep + "\n", tls=True).start()
    registry = DeviceRegistry(RegistryConfig(heartbeat_interval=0.3))
    url = BrokerURL.parse(broker.url, "gateway", (certs / "gateway.password").read_text().strip())
    agent = subprocess.Popen(
        [sys.executable, "-m", "edgesched", "agent", "--broker", broker.url, "--device-id", "pi-07", "--username",
         "pi-07", "--ca-file", str(bundle / "ca.crt"), "--interval", "0.3"],
        env={**os.environ, "EDGESCHED_MQTT_PASSWORD": env["EDGESCHED_MQTT_PASSWORD"],
             "EDGESCHED_STATE_DIR": str(tmp_path)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with RegistryListener(registry, url, ca_file=str(certs / "ca.crt")) as listener:
            listener.wait_connected(10)
            deadline = time.monotonic() + 20
            while not (listener.snapshot().devices.get("pi-07") and listener.snapshot().devices["pi-07"].heartbeat):
                assert time.monotonic() < deadline, "the enrolled board never got through"
                time.sleep(0.1)
    finally:
        agent.kill()
        agent.wait(timeout=10)
        broker.stop()


@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto is not installed (make test installs it)")
@pytest.mark.skipif(os.geteuid() != 0, reason="Mosquitto drops to its own user only when started as root")
def test_mosquitto_as_its_own_user_reads_the_files_the_gateway_install_puts_in_place():
    """As the unit runs it: started as root, Mosquitto switches to the `mosquitto` user before it
    reads its key and password file. With the modes the install gives them it serves an enrolled
    board; with the root-only modes a plain copy gives, it cannot start."""
    import grp
    import pwd

    pwd.getpwnam("mosquitto")  # the Debian package's user
    root = Path(tempfile.mkdtemp(prefix="edgesched-gateway-", dir="/tmp"))
    root.chmod(0o755)  # the test's own temp folder would be closed to the mosquitto user
    certs, broker_dir = root / "certs", root / "broker"
    try:
        for args in (["ca"], ["gateway", "localhost"], ["device", "pi-07"]):
            subprocess.run(["bash", str(DEPLOY / "make-certs.sh"), "--dir", str(certs), *args], check=True,
                           capture_output=True, timeout=60)
        done = subprocess.run(["bash", str(DEPLOY / "gateway" / "install.sh"), "--broker-files", "--certs", str(certs),
                               "--broker-dir", str(broker_dir)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert grp.getgrgid((broker_dir / "server.key").stat().st_gid).gr_name == "mosquitto"
        port = free_port()
        conf = (broker_dir / "mosquitto.conf").read_text().replace("/etc/mosquitto/conf.d/edgesched/", f"{broker_dir}/")
        conf = "\n".join(line for line in conf.splitlines() if not line.startswith(("listener ", "persistence")))
        (root / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\npersistence false\n{conf}\n")

        def start() -> subprocess.Popen:
            return subprocess.Popen([MOSQUITTO, "-c", str(root / "mosquitto.conf")], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)

        broker = start()
        try:
            wait_for_port(port)
            users = {p.username() for p in psutil.Process(broker.pid).children(recursive=False)} | {
                psutil.Process(broker.pid).username()}
            assert users == {"mosquitto"}  # it dropped root before serving
            env = dict(line.split("=", 1) for line in (certs / "devices" / "pi-07" / "device.env").read_text().split())
            agent = subprocess.run(
                [sys.executable, "-c", AGENT_ONCE, str(port), str(certs / "ca.crt"), env["EDGESCHED_MQTT_PASSWORD"]],
                capture_output=True, text=True, timeout=60)
            assert agent.returncode == 0, agent.stdout + agent.stderr
        finally:
            broker.terminate()
            broker.wait(timeout=10)
        (broker_dir / "passwords").chmod(0o600)  # what `cp` as root leaves: readable by root alone
        os.chown(broker_dir / "passwords", 0, 0)
        refused = start()
        try:
            out, _ = refused.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            refused.kill()
            raise AssertionError("Mosquitto started with a password file it cannot read") from None
        assert refused.returncode != 0 and "passwords" in out, out
    finally:
        shutil.rmtree(root, ignore_errors=True)


# A board's broker login over TLS, as its agent makes it: connect, publish once, exit 0.
AGENT_ONCE = """
import sys, time
import paho.mqtt.client as mqtt
port, ca, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pi-07")
c.username_pw_set("pi-07", password)
c.tls_set(ca_certs=ca)
connected = []
c.on_connect = lambda cl, u, f, reason, p: connected.append(not reason.is_failure)
c.connect("localhost", port)
c.loop_start()
deadline = time.monotonic() + 20
while not connected and time.monotonic() < deadline:
    time.sleep(0.05)
assert connected == [True], connected
c.publish("edgesched/default/pi-07/heartbeat", b"{}", qos=1).wait_for_publish(10)
c.disconnect()
"""
