"""Fixtures of the contract suite: one real gRPC server on loopback per adapter, shared by the whole session.

Adapters join by adding a builder to ``_BUILDERS`` (fake and embedded now; vLLM joins in a later issue). Each test
gets the server back in a clean state: resumed, awake, nothing in flight.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest

from agentloop_grpc.engine_adapters.fake import FakeEngine, FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .target import ContractTarget

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # real engines load local files only; nothing may reach a hub


@asynccontextmanager
async def _fake_target() -> AsyncIterator[ContractTarget]:
    # 2 ms per decode step: a 1000-token request stays in flight ~2 s, long enough to act on mid-stream.
    engine = FakeEngine(FakeEngineConfig(token_latency_s=0.002, max_running=64, max_model_len=4096))
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    address = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        yield ContractTarget(
            name="fake",
            address=address,
            channel=channel,
            prompt=[11, 12, 13, 14, 15, 16, 17, 18],
            long_tokens=1000,
            sample_tensor=engine_pb2.TensorChunk(
                name="fake.weight", dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=[2, 2], data=bytes(16)
            ),
        )
    await server.stop(grace_s=1)


@asynccontextmanager
async def _embedded_target() -> AsyncIterator[ContractTarget]:
    from safetensors import safe_open

    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig, model_store

    engine = EmbeddedEngine(EmbeddedEngineConfig(max_running=8, max_model_len=2048))
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    with safe_open(str(model_store.prepare() / "model.safetensors"), framework="pt") as weights:
        norm = weights.get_tensor("model.norm.weight")  # its current value: the update changes no output
    address = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        yield ContractTarget(
            name="embedded",
            address=address,
            channel=channel,
            prompt=[1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198],  # a ChatML user turn
            long_tokens=200,
            sample_tensor=engine_pb2.TensorChunk(
                name="model.norm.weight",
                dtype=engine_pb2.TENSOR_DTYPE_FLOAT32,
                shape=list(norm.shape),
                data=norm.numpy().tobytes(),
            ),
        )
    await server.stop(grace_s=1)


_BUILDERS: dict[str, Callable[[], object]] = {"embedded": _embedded_target, "fake": _fake_target}


@pytest.fixture(scope="session", params=sorted(_BUILDERS))
async def engine_target(request) -> AsyncIterator[ContractTarget]:
    async with _BUILDERS[request.param]() as target:
        yield target


async def _reset(target: ContractTarget) -> None:
    await target.control.Resume(engine_pb2.ResumeRequest(), timeout=30)
    await target.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=60)
    await target.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
    await target.wait_no_requests()


@pytest.fixture
async def engine(engine_target: ContractTarget) -> AsyncIterator[ContractTarget]:
    """The session's server for one adapter, clean before and after the test."""
    await _reset(engine_target)
    yield engine_target
    await _reset(engine_target)

