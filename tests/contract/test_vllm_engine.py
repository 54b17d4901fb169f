"""The vLLM adapter beyond the shared contract, on the session's vLLM server (the same one the contract suite uses).

Same weights, same answers: greedy tokens equal the embedded engine's; vLLM's prefix cache shows in the cached
prompt tokens; weight updates really reach the model in vLLM's engine process (and undoing them restores the
output); structured output constrains what vLLM samples; a grammar vLLM cannot compile is INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import re

import grpc
import numpy as np
import pytest
from safetensors import safe_open

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .conftest import DEFAULT_MODEL_PROMPT
from .target import ContractTarget, collect, generate_error, request

pytestmark = pytest.mark.parametrize("engine_target", ["vllm"], indirect=True)

# ChatML turns of the default model's tokenizer (ids, so no tokenizer is needed to build them).
PROMPTS = [
    DEFAULT_MODEL_PROMPT,
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    [1, 4093, 198, 23830, 288, 253, 1837, 30, 2, 198, 1, 520, 9531, 198],
]


@pytest.fixture(scope="module")
async def embedded():
    """The embedded engine in-process (no server), serving the same default-model checkpoint."""
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle

    engine = EngineLifecycle(EmbeddedEngine(EmbeddedEngineConfig(max_running=4, max_model_len=2048)))
    await engine.start()
    yield engine
    await engine.shutdown()


async def _embedded_greedy(engine, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    from agentloop_grpc.common.types import GenerateRequest, SamplingParams, TokenChunk

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, logprobs=True)
    tokens: list[int] = []
    logprobs: list[float] = []
    async for event in engine.generate(GenerateRequest(f"emb-{len(prompt)}-{prompt[3]}", tuple(prompt), params)):
        if isinstance(event, TokenChunk):
            tokens += event.token_ids
            logprobs += event.logprobs
    return tokens, logprobs


async def test_server_info_matches_the_embedded_engine_on_the_same_checkpoint(engine: ContractTarget, embedded) -> None:
    served, local = await engine.info(), embedded.facts
    assert served.engine_kind == "vllm" and served.model_id == local.model_id
    assert served.tokenizer_fingerprint == local.tokenizer_fingerprint
    assert (served.vocab_size, tuple(served.eos_token_ids)) == (local.vocab_size, local.eos_token_ids)
    assert served.max_model_len == 2048


@pytest.mark.parametrize("index", range(len(PROMPTS)))
async def test_greedy_tokens_equal_the_embedded_engine(engine: ContractTarget, embedded, index: int) -> None:
    prompt = PROMPTS[index]
    served = await collect(
        engine, request(engine, prompt=prompt, max_new_tokens=24, ignore_eos=True, temperature=0, logprobs=True)
    )
    tokens, logprobs = await _embedded_greedy(embedded, prompt, 24)
    assert served.tokens == tokens
    # both report the model's own distribution for greedy requests (vLLM: processed logprobs, no temperature)
    assert served.logprobs == pytest.approx(logprobs, abs=2e-3)


async def test_prefix_cache_hits_show_in_cached_prompt_tokens(engine: ContractTarget) -> None:
    await engine.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    prompt = [(11 * i) % 3000 + 5 for i in range(448)]

    def greedy():
        return request(engine, prompt=prompt, max_new_tokens=8, ignore_eos=True, temperature=0, logprobs=True)

    cold = await collect(engine, greedy())
    warm = await collect(engine, greedy())
    assert cold.complete.cached_prompt_tokens == 0
    # vLLM reuses whole KV blocks and always computes the last prompt token
    assert len(prompt) // 2 < warm.complete.cached_prompt_tokens < len(prompt)
    assert warm.tokens == cold.tokens
    assert warm.logprobs == pytest.approx(cold.logprobs, abs=1e-4)
    assert (await engine.load()).prefix_cache_hit_rate > 0


def _checkpoint_tensor(name: str) -> np.ndarray:
    from agentloop_grpc.common import model_store

    with safe_open(str(model_store.prepare() / "model.safetensors"), framework="np") as weights:
        return weights.get_tensor(name)


async def _update(engine: ContractTarget, tensors: dict[str, np.ndarray]) -> engine_pb2.UpdateWeightsResponse:
    async def stream():
        for name, value in tensors.items():
            chunk = engine_pb2.TensorChunk(
                name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=list(value.shape), data=value.tobytes()
            )
            yield engine_pb2.UpdateWeightsRequest(tensor=chunk)
        yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(flush_cache=True))

    return await engine.control.UpdateWeights(stream(), timeout=120)


async def test_weight_update_reaches_the_model_and_undoing_it_restores_the_output(engine: ContractTarget) -> None:
    # q_proj is fused into vLLM's qkv_proj: the checkpoint name must still land in the right slice
    names = ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    original = {name: _checkpoint_tensor(name) for name in names}

    def greedy():
        return request(engine, max_new_tokens=12, ignore_eos=True, temperature=0, logprobs=True)

    reference = await collect(engine, greedy())
    try:
        perturbed = {name: (value * -3.0).astype(np.float32) for name, value in original.items()}
        response = await _update(engine, perturbed)
        assert response.tensors_updated == 2
        changed = await collect(engine, greedy())
        assert changed.logprobs != pytest.approx(reference.logprobs, abs=1e-3)
        assert changed.complete.weight_version == response.weight_version
    finally:
        await _update(engine, original)
    restored = await collect(engine, greedy())
    assert restored.tokens == reference.tokens
    assert restored.logprobs == pytest.approx(reference.logprobs, abs=1e-4)


@pytest.mark.parametrize(
    ("name", "shape", "needle"),
    [
        ("model.no_such.weight", [576], "not a parameter"),
        ("model.norm.weight", [575], "shape"),
    ],
)
async def test_weight_update_naming_a_wrong_tensor_is_invalid(
    engine: ContractTarget, name: str, shape: list[int], needle: str
) -> None:
    before = (await engine.info()).weight_version

    async def stream():
        data = np.zeros(shape, dtype=np.float32).tobytes()
        chunk = engine_pb2.TensorChunk(name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=shape, data=data)
        yield engine_pb2.UpdateWeightsRequest(tensor=chunk)
        yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit())

    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.control.UpdateWeights(stream(), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in error.value.details()
    assert (await engine.info()).weight_version == before


async def test_sleep_is_reported_truthfully(engine: ContractTarget) -> None:
    info = await engine.info()
    assert info.sleep_releases_memory is False  # vLLM's CPU worker ignores sleep
    slept = await engine.control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE), timeout=60)
    assert slept.memory_released is False and slept.state == engine_pb2.ENGINE_STATE_SLEEPING


def _structured(engine: ContractTarget, **constraint) -> generation_pb2.GenerateRequest:
    req = request(engine, max_new_tokens=48, temperature=0)
    req.structured_output.CopyFrom(generation_pb2.StructuredOutput(**constraint))
    return req


async def test_structured_output_constrains_the_tokens(engine: ContractTarget) -> None:
    from agentloop_grpc.common import model_store

    tokenizer = model_store.load_tokenizer(model_store.prepare())
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    result = await collect(engine, _structured(engine, json_schema=json.dumps(schema)))
    assert result.complete.finish_reason == generation_pb2.FINISH_REASON_STOP
    assert result.tokens[-1] == result.complete.matched_stop_token_id == tokenizer.eos_token_id
    value = json.loads(tokenizer.decode(result.tokens[:-1]))
    assert set(value) == {"a", "b"} and all(isinstance(v, int) for v in value.values())
    digits = await collect(engine, _structured(engine, regex=r"[0-9]{3}"))
    assert re.fullmatch(r"[0-9]{3}", tokenizer.decode(digits.tokens[:-1]))


async def test_grammar_vllm_cannot_compile_is_invalid_argument(engine: ContractTarget) -> None:
    error = await generate_error(engine, _structured(engine, ebnf_grammar="root ::= missing_rule"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "vLLM rejected" in error.details()
    good = await collect(engine, request(engine, max_new_tokens=2, ignore_eos=True))
    assert len(good.tokens) == 2


async def test_metrics_endpoint_keeps_vllms_own_metrics(engine: ContractTarget) -> None:
    """`--metrics-port` serves the process's default registry, where vLLM's stat logger registers its metrics."""
    import urllib.request

    from agentloop_grpc.serving.metrics import ServerMetrics, serve_metrics

    await collect(engine, request(engine, max_new_tokens=2))
    http = serve_metrics(ServerMetrics().registry, "127.0.0.1", 0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http.server_port}/metrics", timeout=10).read().decode()
    finally:
        http.shutdown()
    assert re.search(r"^vllm:num_requests_running\{", text, re.MULTILINE), text[:2000]
    assert "agentloop_server_requests" in text
