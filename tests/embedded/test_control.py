"""Control of the embedded engine: weight updates, sleep and wake, pause modes, admission, flush."""

from __future__ import annotations

import asyncio

import psutil
import pytest
import torch
from safetensors.torch import save_file

from agentloop_grpc.common.errors import (
    EngineOverloadedError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
)
from agentloop_grpc.common.types import (
    ALL_RESOURCES,
    EngineState,
    GenerateComplete,
    NamedTensor,
    PauseMode,
    Resource,
)
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle

from .helpers import assert_serves_reference, chat, generate, make, run

NORM = "model.norm.weight"


def _tensor(name: str, value: torch.Tensor) -> NamedTensor:
    return NamedTensor(name, str(value.dtype).removeprefix("torch."), tuple(value.shape), value.numpy().tobytes())


async def test_update_weights_changes_outputs_and_a_bad_tensor_changes_nothing(engine, reference, tokenizer) -> None:
    model, _ = reference
    original = dict(model.named_parameters())[NORM].detach().clone()
    prompt = chat(tokenizer, "Name a colour.")
    before = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
    version = engine.weight_version
    generator = torch.Generator().manual_seed(0)
    perturbed = original * (1 + 0.5 * torch.randn(original.shape, generator=generator))
    result = await engine.update_weights([_tensor(NORM, perturbed)], version + 1, flush_cache=False)
    assert result.weight_version == version + 1 and result.tensors_updated == 1
    after = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
    assert after.tokens != before.tokens
    assert after.complete.weight_version == version + 1 and after.versions == {version + 1}

    embed = dict(model.named_parameters())["model.embed_tokens.weight"]
    bad_batches = {
        "no.such.weight": [_tensor(NORM, original), _tensor("no.such.weight", original)],
        "shape": [_tensor(NORM, original), _tensor(NORM, original[:10])],
        "dtype": [_tensor(NORM, original), _tensor("model.embed_tokens.weight", embed.detach().half())],
    }
    for needle, tensors in bad_batches.items():
        with pytest.raises(InvalidRequestError, match=needle if needle != "dtype" else "embed_tokens"):
            await engine.update_weights(tensors, version + 2, flush_cache=True)
        assert engine.weight_version == version + 1
        still = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
        assert still.tokens == after.tokens  # the perturbed weights still serve: nothing was applied

    await engine.update_weights([_tensor(NORM, original)], version + 2, flush_cache=True)
    restored = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
    assert restored.tokens == before.tokens


async def test_loading_a_checkpoint_serves_what_transformers_computes_with_it(
    engine, reference, tokenizer, tmp_path
) -> None:
    """LoadWeights' path: greedy tokens and logprobs after loading equal transformers run with the same weights."""
    model, _ = reference
    param = dict(model.named_parameters())[NORM]
    original = param.detach().clone()
    perturbed = original * (1 + 0.5 * torch.randn(original.shape, generator=torch.Generator().manual_seed(1)))
    save_file({NORM: perturbed.contiguous()}, str(tmp_path / "model.safetensors"))
    prompt = chat(tokenizer, "Name a colour.")
    version = engine.weight_version
    try:
        result, read = await engine.load_weights(str(tmp_path), version + 1, flush_cache=True)
        assert (result.weight_version, result.tensors_updated, read) == (version + 1, 1, perturbed.numel() * 4)
        served = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0, logprobs=True)
        with torch.no_grad():
            param.copy_(perturbed)
        assert_serves_reference(served, reference, prompt)
        assert served.versions == {version + 1}
    finally:
        with torch.no_grad():
            param.copy_(original)
        await engine.update_weights([_tensor(NORM, original)], None, flush_cache=True)


async def test_an_update_while_generating_swaps_between_steps_and_keeps_every_token(
    engine, reference, tokenizer
) -> None:
    """No pause: the weights are staged while decoding goes on and swapped in between two steps; every token is
    kept and carries the version of the weights that produced it."""
    model, _ = reference
    same = _tensor(NORM, dict(model.named_parameters())[NORM].detach().clone())  # the values it has: same tokens
    prompt = chat(tokenizer, "Count to twenty.")
    alone = await generate(engine, prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    version = engine.weight_version
    request = make(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    tokens, versions = [], []
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            break
        tokens += event.token_ids
        versions += [event.weight_version] * len(event.token_ids)
        if len(tokens) == 10:
            await engine.update_weights([same], version + 1, flush_cache=False)
    assert tokens == alone.tokens
    swap = versions.index(version + 1)
    assert 10 <= swap < 40 and versions == [version] * swap + [version + 1] * (40 - swap)


async def test_tied_weights_update_under_either_name(engine, reference, tokenizer) -> None:
    model, _ = reference
    embed = dict(model.named_parameters())["model.embed_tokens.weight"].detach().clone()
    version = engine.weight_version
    await engine.update_weights([_tensor("lm_head.weight", embed)], version + 1, flush_cache=True)
    assert engine.weight_version == version + 1


def _rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("level", [1, 2])
async def test_sleep_releases_memory_and_wake_restores_the_same_outputs(engine, tokenizer, level) -> None:
    prompt = chat(tokenizer, "Count to five.")
    before = await generate(engine, prompt, max_new_tokens=8, ignore_eos=True, temperature=0.0)
    rss = _rss()
    assert await engine.sleep(level) is True
    assert engine.state is EngineState.SLEEPING
    if level == 2:
        assert rss - _rss() > 300e6  # the 540 MB of fp32 weights left the process
    with pytest.raises(EngineUnavailableError):
        await generate(engine, prompt, max_new_tokens=2)
    if level == 2:
        assert await engine.wake_up(frozenset({Resource.WEIGHTS})) is EngineState.SLEEPING
    assert await engine.wake_up(ALL_RESOURCES) is EngineState.RUNNING
    after = await generate(engine, prompt, max_new_tokens=8, ignore_eos=True, temperature=0.0)
    assert after.tokens == before.tokens


async def test_sleep_with_requests_in_flight_is_refused(engine, tokenizer) -> None:
    stream = engine.generate(make(chat(tokenizer, "Hi"), max_new_tokens=50, ignore_eos=True))
    await anext(stream)
    with pytest.raises(FailedPreconditionError):
        await engine.sleep(1)
    await stream.aclose()
    assert engine.load().running_requests + engine.load().waiting_requests == 0


async def test_pause_keep_resumes_the_same_stream(engine, tokenizer) -> None:
    request = {"max_new_tokens": 30, "ignore_eos": True, "seed": 3}
    prompt = chat(tokenizer, "Tell me about the moon.")
    reference = await generate(engine, prompt, **request)
    task = asyncio.create_task(generate(engine, prompt, **request))
    while engine.load().running_requests == 0:
        await asyncio.sleep(0.01)
    result = await engine.pause(PauseMode.KEEP)
    assert result.kept_requests == 1 and engine.state is EngineState.PAUSED
    await asyncio.sleep(0.5)
    assert not task.done()
    await engine.resume()
    assert (await task).tokens == reference.tokens


async def test_pause_abort_and_wait(engine, tokenizer) -> None:
    prompt = chat(tokenizer, "Tell me about the sun.")
    running = asyncio.create_task(generate(engine, prompt, max_new_tokens=200, ignore_eos=True))
    while engine.load().running_requests == 0:
        await asyncio.sleep(0.01)
    assert (await engine.pause(PauseMode.ABORT)).aborted_requests == 1
    assert (await running).complete.finish_reason.value == "abort"
    held = asyncio.create_task(generate(engine, prompt, max_new_tokens=3, ignore_eos=True))
    await asyncio.sleep(0.3)
    assert not held.done()
    await engine.resume()
    assert len((await held).tokens) == 3

    running = asyncio.create_task(generate(engine, prompt, max_new_tokens=10, ignore_eos=True))
    while engine.load().running_requests == 0:
        await asyncio.sleep(0.01)
    await engine.pause(PauseMode.WAIT)
    assert running.done() and len(running.result().tokens) == 10
    await engine.resume()


async def test_abort_mid_stream_frees_the_slot(engine, tokenizer) -> None:
    request = make(chat(tokenizer, "Write an essay."), max_new_tokens=300, ignore_eos=True)
    task = asyncio.create_task(run(engine, request))
    while engine.load().running_requests == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert await engine.abort([request.request_id, "unknown"]) == [request.request_id]
    result = await task
    assert result.complete.finish_reason.value == "abort"
    assert result.complete.completion_tokens == len(result.tokens) < 300
    after = await generate(engine, chat(tokenizer, "Hi"), max_new_tokens=2, ignore_eos=True)
    assert len(after.tokens) == 2
    assert engine.load().running_requests == 0


async def test_flush_cache_forgets_prefixes(engine, tokenizer) -> None:
    prompt = chat(tokenizer, "A " * 100)
    await generate(engine, prompt, max_new_tokens=2)
    assert (await generate(engine, prompt, max_new_tokens=2)).complete.cached_prompt_tokens > 0
    await engine.flush_cache()
    assert (await generate(engine, prompt, max_new_tokens=2)).complete.cached_prompt_tokens == 0


async def test_full_waiting_queue_is_overloaded(checkpoint, tokenizer) -> None:
    """(Also serves a checkpoint folder given by path, as `--model PATH` does.)"""
    engine = EngineLifecycle(
        EmbeddedEngine(EmbeddedEngineConfig(model=str(checkpoint), max_running=1, max_waiting=1, max_model_len=256))
    )
    await engine.start()
    try:
        assert engine.facts.model_id == checkpoint.name and engine.facts.max_model_len == 256
        prompt = chat(tokenizer, "Hello")
        first = asyncio.create_task(generate(engine, prompt, max_new_tokens=40, ignore_eos=True))
        while engine.load().running_requests == 0:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(generate(engine, prompt, max_new_tokens=2, ignore_eos=True))
        while engine.load().waiting_requests == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(EngineOverloadedError):
            await generate(engine, prompt, max_new_tokens=2)
        assert len((await first).tokens) == 40 and len((await second).tokens) == 2
    finally:
        await engine.shutdown()


async def test_a_prompt_is_reusable_as_soon_as_its_prefill_is_done(engine, tokenizer) -> None:
    await engine.flush_cache()
    prompt = chat(tokenizer, "Shared system context. " * 12)
    first = asyncio.create_task(generate(engine, prompt, max_new_tokens=60, ignore_eos=True))
    while engine.load().running_requests == 0 or engine.load().kv_cache_usage == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # past the prefill (a few steps)
    second = await generate(engine, prompt, max_new_tokens=2, ignore_eos=True)
    assert not first.done()
    assert second.complete.cached_prompt_tokens >= len(prompt) - engine.adapter.config.prefix_block_size
    await first


async def test_samples_of_one_prompt_arriving_together_compute_it_once(engine, tokenizer) -> None:
    await engine.flush_cache()
    prompt = chat(tokenizer, "A group of samples shares this prompt. " * 8)
    group = await asyncio.gather(
        *(generate(engine, prompt, max_new_tokens=6, ignore_eos=True, seed=s, logprobs=True) for s in range(4))
    )
    cached = sorted(r.complete.cached_prompt_tokens for r in group)
    assert cached[0] == 0 and all(c >= len(prompt) - engine.adapter.config.prefix_block_size for c in cached[1:])
    await engine.flush_cache()
    cold = await generate(engine, prompt, max_new_tokens=6, ignore_eos=True, seed=2, logprobs=True)
    assert group[2].tokens == cold.tokens
    assert group[2].logprobs == pytest.approx(cold.logprobs, abs=1e-4)


async def test_kv_from_before_a_weight_update_never_reenters_the_cache(engine, reference, tokenizer) -> None:
    model, _ = reference
    norm = dict(model.named_parameters())[NORM].detach().clone()
    prompt = chat(tokenizer, "Old weights computed this prompt. " * 6)
    running = asyncio.create_task(generate(engine, prompt, max_new_tokens=40, ignore_eos=True))
    while engine.load().running_requests == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    await engine.update_weights([_tensor(NORM, norm)], engine.weight_version + 1, flush_cache=False)
    await running
    after = await generate(engine, prompt, max_new_tokens=2, ignore_eos=True)
    assert after.complete.cached_prompt_tokens == 0
