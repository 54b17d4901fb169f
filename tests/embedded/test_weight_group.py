"""The embedded engine over a weight-transfer group: a broadcast update serves what transformers computes with
the new weights, and it lands between two decode steps while generation goes on."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import torch

from agentloop_grpc.common.types import GenerateComplete
from agentloop_grpc.common.weight_group import WeightGroupLeader
from agentloop_grpc.common.weight_layout import BucketLayout, TensorSpec, WeightGroupSpec

from .helpers import assert_serves_reference, chat, generate, make

NORM = "model.norm.weight"
UP = "model.layers.3.mlp.up_proj.weight"


@contextlib.asynccontextmanager
async def joined(engine):
    """A group of this test (rank 0) and the engine (rank 1); yields a push(tensors, version) function."""
    name = f"embedded-{uuid.uuid4().hex[:8]}"
    store, port = WeightGroupLeader.host("127.0.0.1", 2, 60)
    spec = WeightGroupSpec(name, "127.0.0.1", port, 2, 1, "gloo", 60)
    forming = asyncio.ensure_future(asyncio.to_thread(WeightGroupLeader.form, store, spec))
    assert await engine.join_weight_group(spec) == [1]
    leader = await forming

    async def push(tensors: dict[str, torch.Tensor], version: int) -> None:
        specs = [TensorSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in tensors.items()]
        layout = BucketLayout.of(specs, 1 << 20)  # several pieces: the MLP weight alone is ~2.4 MB

        def send() -> None:
            assert leader.vote(True)
            leader.send(layout, list(tensors.values()))

        await asyncio.gather(engine.receive_weights(name, layout, version, True), asyncio.to_thread(send))

    try:
        yield push
    finally:
        await engine.leave_weight_group(name)
        leader.close()


async def test_a_broadcast_update_serves_what_transformers_computes_with_it(engine, reference, tokenizer) -> None:
    model, _ = reference
    params = dict(model.named_parameters())
    originals = {name: params[name].detach().clone() for name in (NORM, UP)}
    noise = torch.Generator().manual_seed(2)
    perturbed = {
        name: value * (1 + 0.3 * torch.randn(value.shape, generator=noise)) for name, value in originals.items()
    }
    prompt = chat(tokenizer, "Name a colour.")
    version = engine.weight_version
    async with joined(engine) as push:
        try:
            await push(perturbed, version + 1)
            served = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0, logprobs=True)
            with torch.no_grad():
                for name, value in perturbed.items():
                    params[name].copy_(value)
            assert_serves_reference(served, reference, prompt)
            assert served.versions == {version + 1}
        finally:
            with torch.no_grad():
                for name, value in originals.items():
                    params[name].copy_(value)
            await push(originals, version + 2)  # the same group, a second update: it survives
    assert engine.weight_version == version + 2


async def test_a_broadcast_update_while_generating_keeps_every_token_and_its_version(engine, reference,
                                                                                    tokenizer) -> None:
    model, _ = reference
    same = {NORM: dict(model.named_parameters())[NORM].detach().clone()}  # its current values: the same tokens
    prompt = chat(tokenizer, "Count to twenty.")
    alone = await generate(engine, prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    version = engine.weight_version
    tokens, versions = [], []
    async with joined(engine) as push:
        async for event in engine.generate(make(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)):
            if isinstance(event, GenerateComplete):
                break
            tokens += event.token_ids
            versions += [event.weight_version] * len(event.token_ids)
            if len(tokens) == 10:
                await push(same, version + 1)
    assert tokens == alone.tokens
    swap = versions.index(version + 1)
    assert 10 <= swap < 40 and versions == [version] * swap + [version + 1] * (40 - swap)
