"""Routing replay's record, through the stack: an agent loop on the tiny Qwen3-MoE (embedded engine over gRPC,
through the Router) records the experts of every input position of a two-turn trajectory, equal to what plain
transformers routes for the whole sequence; a generation resumed after an abort keeps each token's routing; the
trajectory's routing survives Parquet and lines up with ``to_batch``'s input ids; a rollout asking for routing on
an engine that cannot report it is refused before it starts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentloop_grpc.agent import (
    AgentLoopConfig,
    AgentLoopManager,
    AgentLoopWorker,
    LoopContext,
    LoopRegistry,
    RetryOnWrongAnswer,
    Sample,
    SamplingConfig,
    Termination,
    WorkerSpec,
)
from agentloop_grpc.agent.batch import to_batch
from agentloop_grpc.agent.parquet import read_parquet, write_parquet
from agentloop_grpc.agent.routing_check import RoutingUnavailableError
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import FinishReason, PauseMode, SamplingParams
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.router.attempts import CallProgress

from . import tiny_moe

MOE_LAYERS = tiny_moe.LAYERS - len(tiny_moe.DENSE_LAYERS)
QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)


@pytest.fixture(scope="module")
def moe_codec(moe_checkpoint):
    return load_codec(str(moe_checkpoint))


@pytest.fixture(scope="module")
async def two_turns(moe_address, moe_codec):
    """A tool-loop trajectory of two model turns with a user turn between (the interaction's retry)."""
    async with Router([moe_address]) as router:
        await router.fleet.wait_ready()
        # the random model never writes the end of turn: a token of its greedy reply ends the first turn instead
        prompt = moe_codec.prompt(list(QUESTION), []).ids
        probe = await router.generate(GenerateCall("probe", prompt, SamplingParams(
            max_new_tokens=4, temperature=0, ignore_eos=True)))
        config = AgentLoopConfig(
            return_routed_experts=True, max_new_tokens_per_turn=6, drift_check="off",
            sampling=SamplingConfig(temperature=0, stop_token_ids=(probe.token_ids[-1],)))
        context = LoopContext(generator=router, codec=moe_codec, config=config,
                              interactions={"retry": RetryOnWrongAnswer(max_attempts=2)})
        [t] = await AgentLoopWorker(LoopRegistry.default(context)).run(
            [Sample(sample_id="moe", messages=QUESTION, interaction="retry", ground_truth="987654321")])
    assert not t.failed, t.error
    return t


def test_every_input_position_of_a_two_turn_trajectory_has_the_routing_transformers_computes(
    two_turns, moe_checkpoint
) -> None:
    t = two_turns
    assert t.assistant_turns == 2 and t.user_turns == 1
    ids = [*t.prompt_ids, *t.response_ids]
    user = t.response_mask.index(0, t.response_mask.index(1))  # the first user token after the first turn
    routing = t.routed_experts
    assert routing is not None and (routing.layers, routing.per_token, routing.num_experts) == (
        MOE_LAYERS, tiny_moe.TOP_K, tiny_moe.EXPERTS)
    assert routing.positions == len(ids) - 1
    # one forward over the whole sequence: the second turn's prompt (the first turn's last token, the user turn)
    # and both turns' tokens each carry the routing of their position
    np.testing.assert_array_equal(routing.array(), tiny_moe.reference_routing(moe_checkpoint, ids[:-1]))
    assert len(t.prompt_ids) + user < routing.positions


def test_the_summary_and_the_report_show_the_routing(two_turns) -> None:
    from agentloop_grpc.agent.trajectory import routing_summary
    from agentloop_grpc.rollout.report import _routing_fact

    plain = dataclasses.replace(two_turns, sample_id="plain", routed_experts=None)
    summary = routing_summary([two_turns, plain])
    assert summary["trajectories"] == 1 and summary["covered_share"] == 1.0
    assert summary["bytes_per_token"] == MOE_LAYERS * tiny_moe.TOP_K  # uint8 ids: 8 experts
    assert "100.0% of positions" in _routing_fact(summary) and _routing_fact(routing_summary([plain])) == ""


def test_the_routing_survives_parquet_and_lines_up_with_the_batch(two_turns, tmp_path) -> None:
    t = two_turns
    [back] = read_parquet(write_parquet([t], tmp_path / "t.parquet"))
    assert back.routed_experts == t.routed_experts and back == t
    # a second row without routing, longer prompt padding for the first
    plain = dataclasses.replace(t, sample_id="plain", routed_experts=None)
    p, r = len(t.prompt_ids) + 3, len(t.response_ids) + 2
    batch = to_batch([t, plain], pad_token_id=0, prompt_length=p, response_length=r).tensors
    routing = batch["routed_experts"]
    assert routing.shape == (2, p + r, MOE_LAYERS, tiny_moe.TOP_K) and str(routing.dtype) == "torch.int16"
    start, n = p - len(t.prompt_ids), len(t.prompt_ids) + len(t.response_ids)
    assert batch["input_ids"][0, start:start + n].tolist() == [*t.prompt_ids, *t.response_ids]
    np.testing.assert_array_equal(routing[0, start:start + n - 1].numpy(), t.routed_experts.array())
    assert (routing[0, :start] == -1).all() and (routing[0, start + n - 1:] == -1).all()  # padding, last token
    assert (routing[1] == -1).all()


async def test_a_generation_resumed_after_an_abort_keeps_each_tokens_routing(moe_address, moe_checkpoint) -> None:
    prompt = [1, 17, 230, 4051, 99, 12, 7, 3000, 42, 5]
    sampling = SamplingParams(max_new_tokens=160, temperature=0, ignore_eos=True, return_routed_experts=True)
    fast = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)
    async with Router([moe_address], fast) as router:
        await router.fleet.wait_ready()
        received, paused, result = 0, False, None
        async for event in router.stream(GenerateCall("resumed", prompt, sampling, max_resumes=2)):
            if isinstance(event, GenerateResult):
                result = event
                break
            received += len(event.token_ids)
            if received >= 4 and not paused:  # a weight update's pause: the engine aborts it, the Router resumes
                paused = True
                (await router.fleet.pause(PauseMode.ABORT)).raise_for_errors()
                (await router.fleet.resume()).raise_for_errors()
    assert result is not None and result.resumes == 1 and len(result.token_ids) == 160
    routing = result.routed_experts
    assert routing is not None and len(routing.prompt) == (len(prompt) - 1) * routing.row_bytes
    served = routed_experts.unpack(routing.prompt + routing.tokens, MOE_LAYERS, tiny_moe.TOP_K, tiny_moe.EXPERTS)
    ids = prompt + list(result.token_ids)
    np.testing.assert_array_equal(served, tiny_moe.reference_routing(moe_checkpoint, ids[:-1]))


def test_a_failover_keeps_the_prompt_routing_of_the_calls_own_prompt() -> None:
    """The lost attempt never completed: the next one's prompt (the call's and the tokens received) reports the
    prompt's routing; only the call's own positions are kept, the received tokens keeping their own."""
    from agentloop_grpc.v1 import generation_pb2

    progress = CallProgress(GenerateCall("s", [5, 6, 7, 8], SamplingParams(max_new_tokens=4,
                                                                            return_routed_experts=True)),
                            "r", 10.0, lambda _s: None)
    progress.routed_on(2, 1, 8)  # two bytes a position
    progress.add(generation_pb2.TokenChunk(token_ids=[9, 10], routed_experts=b"\x01\x02\x03\x04"))
    progress.prompt_routed(b"\x05\x05\x06\x06\x07\x07\x08\x08\x09\x09")  # positions 0..4 of [5, 6, 7, 8, 9, 10]
    progress.add(generation_pb2.TokenChunk(token_ids=[11, 12], routed_experts=b"\x0a\x0b\x0c\x0d"))
    routing = progress.result(FinishReason.LENGTH, None, 0, 0, 0.0).routed_experts
    assert routing is not None
    assert routing.prompt == b"\x05\x05\x06\x06\x07\x07"  # the call's prompt positions 0..2
    assert routing.tokens == b"\x01\x02\x03\x04\x0a\x0b\x0c\x0d"


async def test_a_rollout_asking_for_routing_of_an_engine_that_has_none_is_refused() -> None:
    server = await create_server(make_adapter("fake", {}), "127.0.0.1:0")
    await start_adapter(server)
    try:
        spec = WorkerSpec(engines=(f"127.0.0.1:{server.port}",), loop=AgentLoopConfig(return_routed_experts=True))
        async with AgentLoopManager(spec) as manager:
            with pytest.raises(RoutingUnavailableError, match="cannot report routed experts"):
                await manager.generate([Sample(sample_id="s", messages=QUESTION, loop="single_turn")])
    finally:
        await server.stop(grace_s=1)


def test_a_trajectory_is_refused_with_more_routing_than_input_positions(two_turns) -> None:
    t = two_turns
    routing = t.routed_experts
    assert routing is not None
    too_long = routed_experts.Routing(routing.layers, routing.per_token, routing.num_experts,
                                      routing.ids + routing.ids[: routing.row_bytes])
    with pytest.raises(ValueError, match="input positions"):
        dataclasses.replace(t, routed_experts=too_long)
    assert t.termination in (Termination.STOP, Termination.LENGTH)
