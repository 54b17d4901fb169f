"""Loop options verl users expect: how max_user_turns counts (ours and verl's), a sample's own sampling (greedy
validation), tool metrics kept in the trajectory, and the loop's state sent to the tools that ask for it."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop_grpc.agent import AgentLoopConfig, Sample, Termination
from agentloop_grpc.agent.config import SamplingConfig
from agentloop_grpc.agent.parquet import read_parquet, write_parquet
from agentloop_grpc.agent.row_sample import row_sample
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.server import create_tool_server

from .conftest import call, loop_context

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)
#: Three tool rounds, then an answer.
THREE_ROUNDS = [call("calculator", expression=f"{i}+1") for i in range(3)] + ["The answer is 5."]


def tool_messages(t) -> int:
    return sum(1 for m in t.messages if m["role"] == "tool")


async def test_max_user_turns_counts_interaction_replies_only_by_default(codec):
    async with loop_context(codec, THREE_ROUNDS, AgentLoopConfig(max_user_turns=1)) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.termination is Termination.NO_TOOL_CALL and t.assistant_turns == 4 and tool_messages(t) == 3


async def test_verl_counting_stops_at_max_user_turns_tool_rounds(codec):
    config = AgentLoopConfig(max_user_turns=2, count_tool_rounds_as_user_turns=True)
    async with loop_context(codec, THREE_ROUNDS, config) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    # as verl: two rounds of tool responses appended, the model answered the second, then the limit
    assert t.termination is Termination.TURN_LIMIT and t.assistant_turns == 3 and tool_messages(t) == 2
    assert t.user_turns == 0  # still interaction replies only (verl's num_turns adds tool rounds on its own)


async def test_verl_counting_adds_tool_rounds_and_interaction_replies(codec):
    replies = [call("calculator", expression="2+3"), "It is 6.", "It is 7.", "It is 5."]
    config = AgentLoopConfig(max_user_turns=2, count_tool_rounds_as_user_turns=True)
    async with loop_context(codec, replies, config) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION, interaction="retry", ground_truth="5"))
    # the tool round and one feedback reply make two user turns; the second wrong answer meets the limit
    assert t.termination is Termination.TURN_LIMIT and t.user_turns == 1 and t.assistant_turns == 3


async def test_no_user_turn_limit_with_none(codec):
    config = AgentLoopConfig(max_user_turns=None, count_tool_rounds_as_user_turns=True)
    async with loop_context(codec, THREE_ROUNDS, config) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.termination is Termination.NO_TOOL_CALL and tool_messages(t) == 3


def test_the_verl_manager_maps_max_user_turns_with_verls_counting():
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    from agentloop_grpc.integrations.verl.manager import LoopSettings, loop_config

    rollout = OmegaConf.create({"prompt_length": 64, "response_length": 64, "multi_turn": {"max_user_turns": 3}})
    config = loop_config(rollout, LoopSettings(), validate=False)
    assert config.max_user_turns == 3 and config.count_tool_rounds_as_user_turns
    rollout.multi_turn.max_user_turns = None  # verl's default: no limit
    assert loop_config(rollout, LoopSettings(), validate=False).max_user_turns is None


async def test_a_samples_sampling_replaces_the_configs_for_every_turn(codec):
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.5), turn_sampling=(SamplingConfig(top_k=5),))
    greedy = SamplingConfig(temperature=0.0)
    replies = [call("calculator", expression="2+3"), "The answer is 5."]
    async with loop_context(codec, replies, config) as (_, loops, script):
        await loops.get("tool").run(Sample(sample_id="train", messages=QUESTION))
        trained = [(r.sampling.temperature, r.sampling.top_k) for r in script.requests]
        script.requests.clear()
        await loops.get("tool").run(Sample(sample_id="val", messages=QUESTION, sampling=greedy))
        validated = [(r.sampling.temperature, r.sampling.top_k) for r in script.requests]
        script.requests.clear()
        await loops.get("single_turn").run(Sample(sample_id="one", messages=QUESTION, sampling=greedy))
        single = [(r.sampling.temperature, r.sampling.top_k) for r in script.requests]
    assert trained == [(1.0, 5), (0.5, -1)]
    assert validated == [(0.0, -1), (0.0, -1)] and single == [(0.0, -1)]


def test_a_dataset_row_carries_its_sampling():
    row = {"messages": list(QUESTION), "sampling": {"temperature": 0.0, "top_p": 0.5}}
    sample = row_sample(row, "r/0", "r")
    assert sample.sampling == SamplingConfig(temperature=0.0, top_p=0.5)
    with pytest.raises(ValueError, match=r"sampling.temperature"):
        row_sample({**row, "sampling": {"temperature": -1}}, "r/0", "r")


async def test_tool_metrics_are_kept_per_call_and_written_to_parquet(codec, tmp_path):
    replies = [call("calculator", expression="2+3") + call("calculator", expression="1/0"), "5"]
    async with loop_context(codec, replies) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    first, second = t.tool_call_metrics
    assert (first.tool, first.turn, first.call_id, first.error) == ("calculator", 0, "s-0-0", None)
    assert (second.call_id, second.error) == ("s-0-1", "exception") and "seconds" in second.metrics
    # the ids are those of the assistant message's calls
    assert [c["id"] for c in t.messages[1]["tool_calls"]] == ["s-0-0", "s-0-1"]
    (back,) = read_parquet(write_parquet([t], tmp_path / "t.parquet"))
    assert back.tool_call_metrics == t.tool_call_metrics


class Recording:
    """The gRPC tool client, recording what the loop passes to each Execute besides the call itself."""

    def __init__(self, inner: GrpcToolClient) -> None:
        self.inner = inner
        self.extra: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def execute(self, instance_id: str, arguments_json: str, call_id: str = "", **extra):
        self.extra.append((call_id, extra))
        return await self.inner.execute(instance_id, arguments_json, call_id, **extra)


async def test_only_a_tool_that_asks_gets_the_loops_state_over_grpc(codec):
    config = ToolServerConfig.model_validate(
        {"tools": [{"function": "tests.tools.state_tool:whoami"}, {"function": "tests.tools.state_tool:measure"}]}
    )
    server = await create_tool_server(config, "127.0.0.1:0")
    tools = Recording(GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=30))
    replies = [call("whoami", question="?"), call("measure", text="abc"), call("whoami", question="?"), "done"]
    try:
        async with loop_context(codec, replies, tools=tools) as (_, loops, _s):
            t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    finally:
        await tools.inner.close()
        await server.stop(grace_s=1)
    assert t.termination is Termination.NO_TOOL_CALL and t.tool_errors == 0
    answers = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert answers[0] == "s turn 0 after 2 messages; asked: What is 2 + 3?"
    assert answers[2] == "s turn 2 after 6 messages; asked: What is 2 + 3?"
    assert [(call_id, sorted(extra)) for call_id, extra in tools.extra] == [
        ("s-0-0", ["loop_state"]), ("s-1-0", []), ("s-2-0", ["loop_state"])]
    assert tools.extra[2][1]["loop_state"].messages == t.messages[:6]
    assert [(c.tool, c.turn, sorted(c.metrics)) for c in t.tool_call_metrics] == [
        ("whoami", 0, ["messages", "seconds"]), ("measure", 1, ["chars", "seconds"]),
        ("whoami", 2, ["messages", "seconds"])]
