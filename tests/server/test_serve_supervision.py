"""``serve``'s start against SIGTERM, in process with a real signal: a stop while the engine loads lets the load's
own cleanup finish before the engine is released, and a load that fails releases the engine too (the rules of
``serving.supervise``, which ``agentloop engine launch`` follows as well)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable

import pytest

from agentloop_grpc.common.types import ServerFacts
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.server import serve


class _Loading(FakeEngine):
    """A fake engine whose load takes until SIGTERM, then needs a moment to reap what it began (as vLLM's waits for
    its engine process being built, to stop it), or fails."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.seen: list[str] = []

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        if self.fail:
            self.seen.append("load failed")
            raise RuntimeError("no such model")
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while loading
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)
            self.seen.append("load reaped")
            raise
        raise AssertionError("unreachable")

    async def shutdown(self) -> None:
        self.seen.append("released")
        await super().shutdown()


@pytest.fixture
async def own_signals() -> AsyncIterator[None]:
    """serve installs SIGTERM and SIGINT handlers on the test's loop: take them off after."""
    yield
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)


@pytest.mark.usefixtures("own_signals")
async def test_a_sigterm_while_loading_reaps_the_load_before_releasing_the_engine() -> None:
    engine = _Loading()
    await asyncio.wait_for(serve(engine, "127.0.0.1:0", drain_timeout_s=1), 10)
    assert engine.seen == ["load reaped", "released"]


@pytest.mark.usefixtures("own_signals")
async def test_a_failed_load_releases_the_engine_and_raises() -> None:
    engine = _Loading(fail=True)
    with pytest.raises(RuntimeError, match="no such model"):
        await asyncio.wait_for(serve(engine, "127.0.0.1:0", drain_timeout_s=1), 10)
    assert engine.seen == ["load failed", "released"]
