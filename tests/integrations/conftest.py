"""Fixtures of the trainer integrations: a real embedded engine (the default model) and the built-in tool server,
both served on loopback from a background event loop, as a trainer's process would reach them."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import pytest

from agentloop_grpc.integrations.background_loop import BackgroundLoop


@contextmanager
def _served() -> Iterator[tuple]:
    """(engine address, tool server address, background loop, tool server), stopped on exit."""
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter
    from agentloop_grpc.tools.config import load_config
    from agentloop_grpc.tools.server import create_tool_server

    loop = BackgroundLoop("test-servers")

    async def start():
        engine = await create_server(EmbeddedEngine(EmbeddedEngineConfig(max_running=8, max_model_len=1024)),
                                     "127.0.0.1:0")
        await start_adapter(engine)
        tools = await create_tool_server(load_config(resources.files("agentloop_grpc.tools") / "builtin.yaml"))
        return engine, tools

    engine, tools = loop.run(start())
    try:
        yield f"127.0.0.1:{engine.port}", f"127.0.0.1:{tools.port}", loop, tools
    finally:
        loop.run(engine.stop(grace_s=1))
        loop.run(tools.stop(grace_s=1))
        loop.close()


@pytest.fixture(scope="package")
def servers():
    """One engine and tool server for every module that leaves the engine's weights as loaded (a model load each
    would cost seconds per module on two cores)."""
    with _served() as started:
        yield started


@pytest.fixture(scope="module")
def own_servers():
    """An engine and tool server of the module's own, for a module that pushes new weights to its engine: the
    other modules must keep seeing the bundled model."""
    with _served() as started:
        yield started


@pytest.fixture
def model():
    """The default model and tokenizer for a trainer, only its top two layers trainable (a step takes seconds on
    two cores)."""
    from agentloop_grpc.common import model_store
    from agentloop_grpc.integrations.trl import train_top_layers

    loaded, tokenizer = model_store.load(model_store.prepare())
    train_top_layers(loaded, 2)
    loaded.train()
    return loaded, tokenizer
