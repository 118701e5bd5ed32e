"""Real brokers for tests, on free loopback ports: Mosquitto processes and the embedded one."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from pathlib import Path

from edgesched.broker import EmbeddedBroker, free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Mosquitto:
    """A mosquitto process with a config written to `folder`; `restart()` keeps the port."""

    def __init__(self, folder: Path, conf: str = "allow_anonymous true\n", tls: bool = False) -> None:
        self.folder, self.port, self.tls = folder, free_port(), tls
        self.conf = folder / "mosquitto.conf"
        # `user root`: started as root (CI), mosquitto would switch to the `mosquitto` user, which
        # cannot read the test's private temp folder; started as anyone else, it is ignored.
        self.conf.write_text(f"listener {self.port} 127.0.0.1\npersistence false\nuser root\n{conf}")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts://localhost' if self.tls else 'mqtt://127.0.0.1'}:{self.port}"

    def start(self) -> Mosquitto:
        log = (self.folder / "mosquitto.log").open("ab")
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=log)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


class Embedded:
    """The embedded amqtt broker behind the same small interface as `Mosquitto`."""

    tls = False

    def __init__(self) -> None:
        self.port = free_port()
        self._broker: EmbeddedBroker | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Embedded:
        self._broker = EmbeddedBroker(port=self.port).__enter__()
        return self

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.__exit__(None, None, None)
            self._broker = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


def shipped_config(folder: Path) -> str:
    """deploy/mosquitto/mosquitto.conf with its folder and port pointed at the test's, and a test CA."""
    text = (DEPLOY / "mosquitto.conf").read_text().replace("/etc/mosquitto/conf.d/edgesched/", f"{folder}/")
    keep = [line for line in text.splitlines() if not line.startswith(("listener ", "persistence"))]
    (folder / "edgesched.acl").write_text((DEPLOY / "edgesched.acl").read_text())
    certs = make_test_ca(folder)
    for name, key in (("ca.crt", "ca"), ("server.crt", "cert"), ("server.key", "key")):
        certs[key].rename(folder / name)
    return "\n".join(keep) + "\n"


def password_file(folder: Path, users: dict[str, str]) -> Path:
    path = folder / "passwords"
    path.write_text("")
    for user, password in users.items():
        subprocess.run([MOSQUITTO_PASSWD, "-b", str(path), user, password], check=True, capture_output=True)
    return path


def make_test_ca(folder: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for localhost / 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("edgesched test CA")).issuer_name(name("edgesched test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
              .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
              .add_extension(san, critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    return paths
