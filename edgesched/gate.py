"""The boards' door to the SuperLink: its Fleet API, and nothing else.

Flower 1.41 serves the Fleet API (what SuperNodes speak), the Control API (`flwr run`, `flwr
supernode register`, ...) and the runtime API on one HTTP port. Exposed to the boards' network,
whoever reaches that port could register a SuperNode key of their own: the CA certificate that
TLS needs is in every board's bundle, and registering asks nothing more. So on a gateway the
SuperLink listens on loopback, where only its operator is, and this gate listens for the boards:
it terminates TLS with the gateway's certificate and passes on requests under `/v1/fleet/`
(SuperNodes still sign each one with their enrolled key, which the SuperLink checks); every other
path is refused with 403 and a line in the log.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)
FLEET_PREFIX = "/v1/fleet/"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
TIMEOUT_S = 120.0  # longer than any Fleet API call takes (Flower's client gives up after 30 s)


class FleetGate:
    """An ASGI app forwarding the Fleet API to `upstream` (e.g. https://127.0.0.1:9093)."""

    def __init__(self, upstream: str, ca_file: str | None = None) -> None:
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self.client = httpx.AsyncClient(base_url=upstream.rstrip("/"), verify=verify, timeout=TIMEOUT_S)
        self.app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "PUT", "DELETE"])],
                             lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        await self.client.aclose()

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if not path.startswith(FLEET_PREFIX) or ".." in path:
            what = "/".join(path.split("/")[:4])
            log.warning("refused %s %s from %s (only the Fleet API is served here)", request.method, what,
                        request.client.host if request.client else "?")
            return PlainTextResponse("only the Fleet API is served here; the SuperLink's other APIs are on the "
                                     "gateway's loopback\n", status_code=403)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await self.client.request(request.method, path, params=request.query_params,
                                                 content=await request.body(), headers=headers)
        except httpx.HTTPError as exc:
            log.warning("the SuperLink did not answer %s: %s", path, exc)
            return PlainTextResponse("the SuperLink is not answering\n", status_code=502)
        return Response(upstream.content, upstream.status_code,
                        {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})


def serve(listen: str, upstream: str, certfile: str, keyfile: str, ca_file: str | None) -> None:
    """Run the gate until interrupted: TLS on `listen` (host:port) with the gateway's certificate."""
    import uvicorn

    host, _, port = listen.rpartition(":")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded request is noise
    gate = FleetGate(upstream, ca_file)
    options: dict[str, Any] = {"ssl_certfile": certfile, "ssl_keyfile": keyfile}
    uvicorn.run(gate.app, host=host or "0.0.0.0", port=int(port), log_level="warning", **options)
