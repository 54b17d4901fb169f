"""Routing replay's first half: the embedded engine serves a MoE model (Qwen3-MoE) and reports, on request, the
experts each token was routed to, over real gRPC; an engine that cannot answers the opt-in with a clear status.

The model is tests/embedded/tiny_moe.py's random-weight checkpoint, built once per session (a few MB); the
reference is the same checkpoint run by plain transformers, whose routers are read with forward hooks.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import FinishReason, GenerateComplete, TokenChunk
from agentloop_grpc.engine_adapters import convert
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.serving.server import MAX_MESSAGE_BYTES
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from . import tiny_moe

MOE_LAYERS = tiny_moe.LAYERS - len(tiny_moe.DENSE_LAYERS)


@pytest.fixture(scope="module")
async def moe_server(moe_address):
    channel = grpc.aio.insecure_channel(moe_address)
    yield generation_pb2_grpc.TokenGenerateStub(channel), engine_pb2_grpc.EngineControlStub(channel)
    await channel.close()


def _request(request_id: str, prompt: list[int], routing: bool, **options) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id, prompt_ids=prompt,
        sampling_params=generation_pb2.SamplingParams(
            temperature=0, max_new_tokens=6, ignore_eos=True, return_routed_experts=routing),
        **options,
    )


def _unpack(data: bytes) -> np.ndarray:
    return routed_experts.unpack(data, MOE_LAYERS, tiny_moe.TOP_K, tiny_moe.EXPERTS)


async def test_routing_of_every_token_matches_transformers(moe_server, moe_checkpoint) -> None:
    generate, control = moe_server
    info = await control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=10)
    assert (info.routed_expert_layers, info.routed_experts_per_token, info.num_experts) == (
        MOE_LAYERS, tiny_moe.TOP_K, tiny_moe.EXPERTS)
    prompt = [1, 17, 230, 4051, 99, 12, 7, 3000, 42, 5]
    # one streamed request with routing, decoded beside one without (a batch that mixes both), and a one-message
    # call whose chunks the server merges
    plain = asyncio.ensure_future(generate.GenerateUnary(
        generation_pb2.GenerateUnaryRequest(request=_request("plain", prompt[:7], False)), timeout=60))
    tokens, chunk_routes, complete = [], [], None
    async for message in generate.Generate(_request("routed", prompt, True), timeout=60):
        if message.HasField("chunk"):
            tokens += message.chunk.token_ids
            assert len(message.chunk.routed_experts) == len(message.chunk.token_ids) * MOE_LAYERS * tiny_moe.TOP_K
            chunk_routes.append(message.chunk.routed_experts)
        else:
            complete = message.complete
    merged = await generate.GenerateUnary(generation_pb2.GenerateUnaryRequest(
        request=_request("merged", prompt, True)), timeout=60)
    plain_reply = await plain

    assert len(tokens) == 6 and complete is not None
    assert len(complete.prompt_routed_experts) == (len(prompt) - 1) * MOE_LAYERS * tiny_moe.TOP_K
    served = np.concatenate([_unpack(complete.prompt_routed_experts), _unpack(b"".join(chunk_routes))])
    # position i's routing: the forward whose input is token i; the last token is sampled, never an input
    reference = tiny_moe.reference_routing(moe_checkpoint, prompt + tokens[:-1])
    assert served.shape == reference.shape == (len(prompt) + 5, MOE_LAYERS, tiny_moe.TOP_K)
    np.testing.assert_array_equal(served, reference)
    assert len(set(served.reshape(-1).tolist())) > 2  # the router really spreads tokens over experts

    assert list(merged.complete.tokens.token_ids) == tokens
    assert merged.complete.tokens.routed_experts == b"".join(chunk_routes)
    assert merged.complete.prompt_routed_experts == complete.prompt_routed_experts
    assert not plain_reply.complete.tokens.routed_experts and not plain_reply.complete.prompt_routed_experts


async def test_an_engine_that_cannot_report_routing_refuses_the_opt_in() -> None:
    server = await create_server(make_adapter("fake", {}), "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            info = await engine_pb2_grpc.EngineControlStub(channel).GetServerInfo(
                engine_pb2.GetServerInfoRequest(), timeout=10)
            assert info.routed_expert_layers == 0
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GenerateUnary(
                    generation_pb2.GenerateUnaryRequest(request=_request("r", [1, 2, 3], True)), timeout=10)
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "return_routed_experts" in refused.value.details()
            reply = await stub.GenerateUnary(
                generation_pb2.GenerateUnaryRequest(request=_request("p", [1, 2, 3], False)), timeout=10)
            assert reply.complete.completion_tokens == 6
    finally:
        await server.stop(grace_s=1)


def test_a_long_turn_of_a_large_moe_fits_one_message() -> None:
    """docs/contract.md's bound: a 1,000-token turn of a 48-layer top-8 model, prompt of 1,000 tokens too."""
    layers, top_k, tokens = 48, 8, 1000
    for experts, id_size in ((128, 1), (512, 2)):
        size = routed_experts.wire_bytes(tokens, layers, top_k, experts)
        assert size == tokens * layers * top_k * id_size  # 384,000 ids
        ids = np.random.default_rng(0).integers(0, experts, (tokens, layers, top_k))
        packed = routed_experts.pack(ids, experts)
        assert len(packed) == size
        np.testing.assert_array_equal(routed_experts.unpack(packed, layers, top_k, experts), ids)
        message = generation_pb2.GenerateResponse()
        convert.fill_complete(
            message.complete,
            GenerateComplete(finish_reason=FinishReason.LENGTH, prompt_tokens=tokens + 1,
                             completion_tokens=tokens, weight_version=0, prompt_routed_experts=packed),
            TokenChunk(token_ids=tuple(range(tokens)), weight_version=0, routed_experts=packed),
        )
        assert 2 * size < message.ByteSize() < 2 * size + 16 * 1024
        assert message.ByteSize() < MAX_MESSAGE_BYTES / 40
