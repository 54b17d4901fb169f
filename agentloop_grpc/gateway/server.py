"""Serving the gateway's app with uvicorn inside the caller's event loop (the CLI, the rollout driver, tests), on
a port that may be 0 (the bound one is read back), stopped gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from .app import refusal_body
from .config import GatewayLimits
from .http_connection import GatewayConnection


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller owns the signals (the CLI's Ctrl-C, the rollout's, pytest's)


@contextlib.asynccontextmanager
async def serve_app(app: FastAPI, host: str = "127.0.0.1", port: int = 0, certificate: str | Path | None = None,
                    private_key: str | Path | None = None, limits: GatewayLimits | None = None) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http(s)://host:port``). ``limits``: the gateway's
    (None: the defaults), whose timeouts and connection bound its connections keep (see http_connection)."""
    limits = limits or GatewayLimits()
    connection = functools.partial(GatewayConnection, limits=limits, refusal=refusal_body)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", ws="none",
                            http=connection,  # type: ignore[arg-type]  # uvicorn calls it as it would a class
                            timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]  # a float works
                            ssl_certfile=str(certificate) if certificate else None,
                            ssl_keyfile=str(private_key) if private_key else None, timeout_graceful_shutdown=5)
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():  # it failed to start (e.g. the port is taken): its exception says why
                task.result()
                raise RuntimeError("the gateway's HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if certificate else "http"
        yield f"{scheme}://{host}:{bound}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
