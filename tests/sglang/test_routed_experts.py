"""Routed experts through the SGLang adapter over real gRPC: the stand-in sends ``meta_info["routed_experts"]`` as
SGLang does (base64 int32 rows of every decoder layer, with the finished output only) and the adapter hands each
chunk its tokens' rows of the MoE layers. (An engine started without capture refuses the opt-in: test_routing.py.)"""

from __future__ import annotations

import asyncio
import base64
import types
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from agentloop_grpc.common import routed_experts
from agentloop_grpc.engine_adapters.sglang import routing
from agentloop_grpc.engine_adapters.sglang.outputs import OutputReader
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .conftest import sglang_server
from .standin import ROUTING_DENSE, ROUTING_LAYERS, ROUTING_TOP_K, standin_routing, standin_token

pytestmark = pytest.mark.usefixtures("ray_cluster")

EXPERTS = 8
MOE_LAYERS = tuple(i for i in range(ROUTING_LAYERS) if i not in ROUTING_DENSE)
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
VOCAB = 32_000


def _request(request_id: str, routed: bool, tokens: int = 6) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id, prompt_ids=PROMPT,
        sampling_params=generation_pb2.SamplingParams(
            temperature=0, max_new_tokens=tokens, ignore_eos=True, return_routed_experts=routed))


def _unpack(data: bytes) -> np.ndarray:
    return routed_experts.unpack(data, len(MOE_LAYERS), ROUTING_TOP_K, EXPERTS)


@pytest.fixture(scope="module")
async def channel(moe_group) -> AsyncIterator[grpc.aio.Channel]:
    async with sglang_server(moe_group) as server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


async def test_each_chunk_carries_its_tokens_routing_and_the_complete_the_prompts(channel, moe_group) -> None:
    await moe_group.recorder.clear.remote()
    info = await engine_pb2_grpc.EngineControlStub(channel).GetServerInfo(engine_pb2.GetServerInfoRequest())
    assert (info.routed_expert_layers, info.routed_experts_per_token, info.num_experts) == (2, 2, EXPERTS)
    stub = generation_pb2_grpc.TokenGenerateStub(channel)
    chunks, complete = [], None
    async for message in stub.Generate(_request("routed", True), timeout=30):
        if message.HasField("chunk"):
            chunks.append(message.chunk)
        else:
            complete = message.complete
    plain = await stub.GenerateUnary(generation_pb2.GenerateUnaryRequest(request=_request("plain", False)))

    tokens = [t for chunk in chunks for t in chunk.token_ids]
    assert tokens == [standin_token(0, PROMPT, i, VOCAB)[0] for i in range(6)] and complete is not None
    for chunk in chunks:
        assert len(chunk.routed_experts) == len(chunk.token_ids) * len(MOE_LAYERS) * ROUTING_TOP_K
    served = np.concatenate([_unpack(complete.prompt_routed_experts), *(_unpack(c.routed_experts) for c in chunks)])
    # one row per input position of prompt + tokens[:-1]; SGLang's dense-layer rows dropped
    expected = standin_routing(PROMPT + tokens[:-1], EXPERTS)[:, MOE_LAYERS, :]
    assert served.shape == (len(PROMPT) + 5, len(MOE_LAYERS), ROUTING_TOP_K)
    np.testing.assert_array_equal(served, expected)
    assert len(plain.complete.tokens.token_ids) + sum(len(c.token_ids) for c in plain.chunks) == 6
    assert not any(c.routed_experts for c in [*plain.chunks, plain.complete.tokens])
    assert not plain.complete.prompt_routed_experts
    asked = [call["return_routed_experts"] for call in await moe_group.calls("async_generate", 2)]
    assert sorted(asked) == [False, True]  # SGLang is asked only for the request that wants it


async def test_an_aborted_routed_request_sends_no_token_without_its_routing(channel, moe_group) -> None:
    # SGLang's routing comes with its final output, which a cancelled stream never gets: the held tokens are dropped
    await moe_group.recorder.clear.remote()
    stub = generation_pb2_grpc.TokenGenerateStub(channel)
    call = stub.GenerateUnary(generation_pb2.GenerateUnaryRequest(request=_request("aborted", True, tokens=3000)))
    await moe_group.calls("async_generate")
    await asyncio.sleep(0.05)  # tokens are being produced and held
    await stub.Abort(generation_pb2.AbortRequest(request_ids=["aborted"]), timeout=10)
    reply = await call
    assert reply.complete.finish_reason == generation_pb2.FINISH_REASON_ABORT
    assert not reply.chunks and not reply.complete.tokens.token_ids and reply.complete.completion_tokens == 0
    assert not reply.complete.prompt_routed_experts


def test_moe_layers_follow_the_models_config() -> None:
    def config(**fields) -> types.SimpleNamespace:
        return types.SimpleNamespace(num_hidden_layers=6, num_experts_per_tok=2, **fields)

    assert routing.moe_layers(config(num_experts=8, mlp_only_layers=[1], decoder_sparse_step=1)) == (0, 2, 3, 4, 5)
    assert routing.moe_layers(config(num_experts=8, decoder_sparse_step=2)) == (1, 3, 5)  # Qwen2-MoE's rule
    assert routing.moe_layers(config(n_routed_experts=64, first_k_dense_replace=3)) == (3, 4, 5)  # DeepSeek-V3
    assert routing.moe_layers(config(num_local_experts=32)) == tuple(range(6))  # gpt-oss, Mixtral
    assert routing.layout_of(config()) is None  # dense


def test_routing_that_does_not_hold_whole_rows_is_an_engine_fault() -> None:
    layout = routing.RoutingLayout(ROUTING_LAYERS, MOE_LAYERS, ROUTING_TOP_K, EXPERTS)
    reader = OutputReader(False, 0, layout)
    meta = {"finish_reason": {"type": "length"}, "prompt_tokens": 2, "completion_tokens": 1,
            "routed_experts": base64.b64encode(np.zeros(5, dtype="<i4").tobytes()).decode()}
    with pytest.raises(RuntimeError, match="not rows of 3 layers"):
        reader.read({"output_ids": [7], "meta_info": meta})
