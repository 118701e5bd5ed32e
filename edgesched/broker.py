"""The embedded MQTT broker: amqtt (pure Python) on loopback, in a background thread.

With no broker URL, a single machine needs nothing else: the gateway starts this broker and
devices on the same host connect to it. For a real fleet use Mosquitto (deploy/mosquitto/):
TLS, passwords and per-device ACLs. amqtt is installed with `--no-deps` (see README): its
package metadata asks for a newer typer than Flower allows, but the broker never uses it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from types import TracebackType

from edgesched.errors import EdgeschedError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedBroker:
    """`with EmbeddedBroker() as broker:` serves MQTT at `broker.url` until the block ends."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port or free_port(host)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgesched-broker", daemon=True)
        self._broker = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def __enter__(self) -> EmbeddedBroker:
        try:
            from amqtt.broker import Broker
        except ImportError as exc:
            raise EdgeschedError(
                "the embedded broker needs amqtt: pip install --no-deps amqtt==0.12.1 'edgesched[broker]', "
                "or pass a broker URL (e.g. mqtt://localhost:1883 for Mosquitto)"
            ) from exc
        for name in ("amqtt", "transitions"):
            logging.getLogger(name).setLevel(logging.WARNING)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._thread.start()

        async def start() -> object:
            broker = Broker(config)
            await broker.start()
            return broker

        try:
            self._broker = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        except Exception as exc:
            self._stop_loop()
            raise EdgeschedError(f"the embedded MQTT broker could not start on {self.host}:{self.port}: {exc}") from exc
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._broker is not None:
            asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=30)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
