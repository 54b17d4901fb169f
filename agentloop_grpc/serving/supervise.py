"""Supervision of something that starts slowly and must stop cleanly: an engine server loading its model, a launcher
starting its servers.

``supervise(start, stop, stop_requested)`` runs ``start()`` until it returns or a stop is requested (SIGTERM or
SIGINT: ``serving.server.stop_signal``), whichever comes first, then waits for that request, and ``stop()`` runs in
every case. The rules, written once:
  - a stop requested while starting cancels the start and waits for its cancellation to finish (a start that must
    reap what it began, a vLLM engine process being built, gets to), then stops: never the signal's default death;
  - a start that fails is stopped too (what it made is released), and its error is raised after;
  - ``on_started(result)`` runs only for a start that completed before any stop was requested.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def supervise(
    start: Callable[[], Awaitable[T]],
    stop: Callable[[], Awaitable[object]],
    stop_requested: asyncio.Event,
    on_started: Callable[[T], object] | None = None,
) -> T | None:
    """Start, wait until ``stop_requested`` is set, stop (see the module docstring). Returns what ``start``
    returned, or None when the stop came first."""
    starting = asyncio.ensure_future(start())
    stopping = asyncio.ensure_future(stop_requested.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            return None
        started = starting.result()  # a failed start raises here, after the finally's stop
        if on_started is not None and not stop_requested.is_set():
            on_started(started)
        await stopping
        return started
    finally:
        stopping.cancel()
        try:
            if not starting.done():  # stopped (or cancelled) while starting: its own cleanup runs to its end first
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
        finally:
            await stop()
