"""BackgroundLoop: one asyncio event loop on its own thread, for trainers that call us synchronously.

A trainer's process is synchronous (TRL calls ``rollout_func`` from its training step), while the manager, its
channels and its tool clients live on one event loop for the whole run. Opening them anew per step would cost a
channel handshake and a tokenizer load every step; this loop keeps them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop running on a daemon thread; ``run`` submits a coroutine and waits for its result."""

    def __init__(self, name: str = "agentloop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the loop and return its result (its exception is raised here)."""
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("the background loop is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop without waiting: its future (cancel() cancels the coroutine)."""
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("the background loop is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
