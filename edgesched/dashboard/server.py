"""The dashboard's server: one run directory shown live in a browser and as Prometheus metrics.

`app(run_dir)` serves the page (edgesched/dashboard/static, with plotly.js from the installed
plotly package: nothing is fetched from the internet), `/api/view` (edgesched.observe's view as
JSON), `/api/stream` (the same as server-sent events, pushed whenever the run directory has
something new, checked every `poll_s`) and `/metrics`. A gateway's run, a running simulation
(`edgesched simulate --dashboard`) and a finished run (`edgesched dashboard RUN_DIR`) are all
served this way. Everything is GET; nothing here writes.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import plotly
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from edgesched.dashboard.metrics import RunCollector
from edgesched.errors import ConfigError
from edgesched.observe import LOCK_FILE, RunWatch

STATIC = Path(__file__).parent / "static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
DEFAULT_PORT = 8765


def app(run_dir: Path, poll_s: float = 1.0) -> Starlette:
    watch = RunWatch(run_dir)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(watch))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def plotly_js(request: Request) -> Response:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    async def view(request: Request) -> Response:
        watch.refresh()
        return JSONResponse(watch.view())

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def stream(request: Request) -> Response:
        async def updates() -> AsyncIterator[str]:
            shown = -1
            while not await request.is_disconnected():
                watch.refresh()
                if watch.version != shown:
                    shown = watch.version
                    yield f"data: {json.dumps(watch.view())}\n\n"
                await asyncio.sleep(poll_s)

        return StreamingResponse(updates(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return Starlette(routes=[
        Route("/", page), Route("/api/view", view), Route("/api/stream", stream), Route("/metrics", metrics),
        Route("/static/plotly.min.js", plotly_js), Mount("/static", StaticFiles(directory=STATIC)),
    ])


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or a one-line error naming what is wrong."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror}") from None
    sock.listen(64)
    return sock


def serve(run_dir: Path, host: str, port: int) -> None:
    """Serve `run_dir`'s dashboard until interrupted."""
    import uvicorn

    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    starting = all(p.name == LOCK_FILE for p in run_dir.iterdir())  # empty, or a run about to start
    if not (run_dir / "config.json").exists() and not starting:
        raise ConfigError(f"{run_dir} is not a run directory (it has no config.json)")
    sock = bind(host, port)
    print(f"serving {run_dir} on http://{host}:{port}/ (Ctrl-C stops)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app(run_dir), log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
