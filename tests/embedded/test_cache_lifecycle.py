"""The embedded prefix cache over a trajectory's life and the weights' (issue 37): an ended session's blocks leave
first; after a weight update without flush, no request is served KV of the old weights, and those blocks leave
before the new ones. One engine with a 12-block cache, so a few prompts fill it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import torch

from agentloop_grpc.common.types import GenerateRequest, NamedTensor
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle

from .helpers import Result, assert_serves_reference, make, run

BLOCK = 16
NORM = "model.norm.weight"


@pytest.fixture(scope="module")
async def small_cache() -> AsyncIterator[EngineLifecycle]:
    config = EmbeddedEngineConfig(max_running=2, max_model_len=512, prefill_chunk=64, prefix_block_size=BLOCK,
                                  prefix_cache_tokens=12 * BLOCK)
    engine = EngineLifecycle(EmbeddedEngine(config))
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture
async def engine(small_cache: EngineLifecycle) -> EngineLifecycle:
    await small_cache.flush_cache()
    return small_cache


def _ids(base: int, length: int = 4 * BLOCK) -> list[int]:
    return [(base + 7 * i) % 5000 + 10 for i in range(length)]


async def _generate(engine, prompt: list[int], session: str = "", **sampling) -> Result:
    sampling.setdefault("max_new_tokens", 1)
    request: GenerateRequest = make(prompt, temperature=0.0, **sampling)
    return await run(engine, GenerateRequest(request.request_id, request.prompt_ids, request.sampling,
                                             session_id=session))


async def test_an_ended_sessions_blocks_are_evicted_before_an_older_live_sessions(engine) -> None:
    live, ended = _ids(1), _ids(2)  # 4 blocks each (one token generated: nothing more is stored)
    await _generate(engine, live, "live")
    await _generate(engine, ended, "ended")
    assert await engine.end_sessions(["ended", "never-seen"]) == 4
    assert (await _generate(engine, _ids(3, 8 * BLOCK))).complete.cached_prompt_tokens == 0  # 16 blocks: 4 go
    # the live session's blocks are the least recently used, yet they stay: the ended session's went
    assert (await _generate(engine, live)).complete.cached_prompt_tokens == 3 * BLOCK
    assert (await _generate(engine, ended)).complete.cached_prompt_tokens == 0


def _tensor(value: torch.Tensor) -> NamedTensor:
    return NamedTensor(NORM, "float32", tuple(value.shape), value.numpy().tobytes())


async def test_after_an_update_without_flush_no_old_kv_is_served_and_old_blocks_leave_first(
    engine, reference
) -> None:
    model, _ = reference
    param = dict(model.named_parameters())[NORM]
    original = param.detach().clone()
    perturbed = original * (1 + 0.5 * torch.randn(original.shape, generator=torch.Generator().manual_seed(3)))
    prompt = _ids(4)
    greedy = {"max_new_tokens": 8, "ignore_eos": True, "logprobs": True}
    cache = engine.adapter.prefix_cache
    try:
        await _generate(engine, prompt, **greedy)
        assert (await _generate(engine, prompt, **greedy)).complete.cached_prompt_tokens == 3 * BLOCK
        await engine.update_weights([_tensor(perturbed)], engine.weight_version + 1, flush_cache=False)
        assert cache.stale_blocks == 4  # kept: the prompt's and its output's blocks
        fresh = await _generate(engine, prompt, **greedy)
        assert fresh.complete.cached_prompt_tokens == 0  # not one block of the old weights
        with torch.no_grad():
            param.copy_(perturbed)
        assert_serves_reference(fresh, reference, prompt)  # what transformers computes with the new weights
        again = await _generate(engine, prompt, **greedy)
        assert again.complete.cached_prompt_tokens == 3 * BLOCK and again.tokens == fresh.tokens
        await _generate(engine, _ids(5))  # 12 blocks: full
        await _generate(engine, _ids(6))  # 4 more: the 4 stale ones go first
        assert cache.stale_blocks == 0
        assert (await _generate(engine, prompt)).complete.cached_prompt_tokens == 3 * BLOCK
    finally:
        with torch.no_grad():
            param.copy_(original)
        await engine.update_weights([_tensor(original)], None, flush_cache=True)
