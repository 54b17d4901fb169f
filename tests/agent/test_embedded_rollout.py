"""The agent loop on the real default model (embedded engine): a constrained multi-turn tool trajectory whose
logprobs equal a recompute by transformers, and partial rollout across a weight update."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import (
    AgentLoopConfig,
    AgentLoopWorker,
    LoopContext,
    LoopRegistry,
    Sample,
    SamplingConfig,
    Termination,
)
from agentloop_grpc.agent.manager import update_weights_mid_rollout
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.integrations.logprob_check import recompute_logprobs
from agentloop_grpc.router import Fleet, Router

from .conftest import WatchedRouter, local_tools

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def embedded_server():
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    server = await create_server(EmbeddedEngine(EmbeddedEngineConfig(max_running=8, max_model_len=2048)), "127.0.0.1:0")
    await start_adapter(server)
    yield f"127.0.0.1:{server.port}"
    await server.stop(grace_s=1)


@pytest.fixture(scope="module")
def model():
    from agentloop_grpc.common import model_store

    loaded, _ = model_store.load(model_store.prepare())
    return loaded


def _recompute(model, codec, trajectory, grammar: str) -> list[float]:
    """Logprobs of every model token under the distribution it was sampled from (temperature 1, no truncation;
    the grammar's mask replayed for constrained turns), from one forward pass over the final sequence."""
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(codec.tokenizer, vocab_size=model.config.vocab_size)
    return recompute_logprobs(model, trajectory, 0.0, xgrammar.GrammarCompiler(info).compile_grammar(grammar))


async def test_constrained_tool_trajectory_logprobs_match_a_recompute(embedded_server, model, codec):
    config = AgentLoopConfig(
        constrain_tool_calls=True,
        max_assistant_turns=3,
        max_new_tokens_per_turn=64,
        max_parallel_tool_calls=1,
        # greedy: at temperature 1 the 135M model wanders inside JSON strings until the turn's budget ends;
        # greedy logprobs are reported under the masked distribution at temperature 1, so the check is the same
        sampling=SamplingConfig(temperature=0.0),
        drift_check="report",
    )
    tools = local_tools()
    sample = Sample(
        sample_id="real-1",
        messages=({"role": "user", "content": "What is 17 * 23? Use the calculator, then submit the result with "
                   "check_answer."},),
        tools_kwargs={"check_answer": {"ground_truth": "391"}},
    )
    async with Router([embedded_server]) as router:
        await router.fleet.wait_ready()
        specs = {s.name: s for s in await tools.list_tools()}
        context = LoopContext(generator=router, codec=codec, config=config, tools=tools, tool_specs=specs)
        try:
            [t] = await AgentLoopWorker(LoopRegistry.default(context)).run([sample])
        finally:
            await tools.close()
    assert not t.failed, t.error
    assert t.constrained and t.assistant_turns >= 2 and t.tool_calls >= 2 and t.malformed_tool_calls == 0
    assert 0 in t.response_mask and t.response_mask.count(1) > 20
    grammar = context.parser.constraint([specs[n].openai() for n in sorted(specs)], config.max_parallel_tool_calls)
    recomputed = _recompute(model, codec, t, grammar)
    recorded = [lp for lp, m in zip(t.response_logprobs, t.response_mask, strict=True) if m]
    assert len(recomputed) == len(recorded)
    worst = max(abs(a - b) for a, b in zip(recorded, recomputed, strict=True))
    assert worst < 1e-4, worst


@pytest.mark.parametrize("pause", ["abort", "none"])
async def test_partial_rollout_keeps_every_token_across_a_weight_update(embedded_server, codec, pause):
    """Paused with ABORT, the loops resume the aborted generations; not paused ("none"), the engine swaps the
    weights between two steps of the running ones. Either way every token is kept, tagged with its version."""
    from safetensors import safe_open

    from agentloop_grpc.common import model_store

    with safe_open(str(model_store.prepare() / "model.safetensors"), framework="pt") as weights:
        norm = weights.get_tensor("model.norm.weight")  # its current value: greedy outputs stay comparable
    tensor = NamedTensor("model.norm.weight", "float32", tuple(norm.shape), norm.numpy().tobytes())
    config = AgentLoopConfig(max_new_tokens_per_turn=40, sampling=SamplingConfig(temperature=0.0))
    prompts = ["Tell me a long story about a dragon.", "Describe the ocean in detail.", "Explain how rain forms."]
    samples = [Sample(sample_id=f"p{i}", loop="single_turn", messages=({"role": "user", "content": p},))
               for i, p in enumerate(prompts)]
    async with AsyncExitStack() as stack:
        router = await stack.enter_async_context(Router([embedded_server]))
        control = await stack.enter_async_context(Fleet([embedded_server]))
        await router.fleet.wait_ready()
        [info] = (await control.server_info()).responses.values()
        version = info.weight_version + 1
        watch = WatchedRouter(router)
        worker = AgentLoopWorker(LoopRegistry.default(LoopContext(generator=watch, codec=codec, config=config)))
        rollout = asyncio.create_task(worker.run(samples))
        await watch.wait(lambda: len(watch.tokens) == 3 and min(watch.tokens.values()) >= 4)
        await update_weights_mid_rollout(control, [tensor], version, pause=pause)
        interrupted = await rollout
        # the same samples again, uninterrupted, on the same (numerically unchanged) weights
        reference = await AgentLoopWorker(
            LoopRegistry.default(LoopContext(generator=router, codec=codec, config=config))
        ).run(samples)
    # the Router resumed every aborted generation with its tokens: none ends aborted, and with ABORT some resumed
    assert not [r for r in watch.results if r.finish_reason.value == "abort"]
    assert bool([r for r in watch.results if r.resumes]) == (pause == "abort")
    for t, ref in zip(interrupted, reference, strict=True):
        assert not t.failed, t.error
        assert t.termination in (Termination.STOP, Termination.LENGTH)
        assert t.response_ids == ref.response_ids  # nothing lost, nothing duplicated
    resumed = [t for t in interrupted if t.resumed_generations]
    assert bool(resumed) == (pause == "abort")
    spanning = [t for t in interrupted if t.min_weight_version != t.max_weight_version]
    assert spanning  # the update landed while every sample was decoding
    for t in spanning:
        assert t.min_weight_version == version - 1 and t.max_weight_version == version
        assert sorted(t.weight_versions) == list(t.weight_versions)  # old tokens first, then new ones


async def test_the_real_model_calls_an_mcp_servers_tool(embedded_server, codec):
    """A constrained tool loop on the real model whose only tool is mcp-server-time's, served by a ToolExecute
    server that runs the MCP server for the trajectory: the call is the model's, the answer the MCP server's."""
    import sys
    from pathlib import Path

    pytest.importorskip("mcp_server_time", reason="the dev extra's MCP server is not installed")
    from agentloop_grpc.tools.client import GrpcToolClient
    from agentloop_grpc.tools.config import ToolServerConfig
    from agentloop_grpc.tools.server import create_tool_server

    time_server = [str(Path(sys.executable).parent / "mcp-server-time"), "--local-timezone", "UTC"]
    config = ToolServerConfig.model_validate(
        {"tools": [{"mcp": {"name": "time", "command": time_server, "tools": ["get_current_time"]}}]})
    loop = AgentLoopConfig(constrain_tool_calls=True, max_assistant_turns=2, max_new_tokens_per_turn=40,
                           max_parallel_tool_calls=1, sampling=SamplingConfig(temperature=0.0))
    sample = Sample(sample_id="mcp-1", messages=(
        {"role": "user", "content": "What time is it now in UTC? Call get_current_time with timezone UTC."},))
    server = await create_tool_server(config, "127.0.0.1:0")
    tools = GrpcToolClient(f"127.0.0.1:{server.port}")
    try:
        async with Router([embedded_server]) as router:
            await router.fleet.wait_ready()
            specs = {s.name: s for s in await tools.list_tools()}
            context = LoopContext(generator=router, codec=codec, config=loop, tools=tools, tool_specs=specs)
            [t] = await AgentLoopWorker(LoopRegistry.default(context)).run([sample])
    finally:
        await tools.close()
        await server.stop(grace_s=1)
    assert not t.failed, t.error
    calls = [m for m in t.tool_call_metrics if m.tool == "get_current_time"]
    assert calls and all(m.error != "infrastructure" for m in calls)
    answer = next(m for m in t.messages if m["role"] == "tool")["content"]  # what the MCP server said
    assert '"timezone"' in answer or "timezone" in answer.lower(), answer
    assert server.instances.live_instances == 0
