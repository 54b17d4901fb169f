"""The gateway's Chat Completions through the real ``openai`` SDK, on a scripted fake engine: the recorded
trajectory is the one our tool loop records for the same conversation."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from agentloop_grpc.agent import AgentLoopConfig, Sample, SamplingConfig
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from ..agent.conftest import call, loop_context
from .conftest import scripted_gateway

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
REPLIES = [call("calculator", expression="2+3"), "The answer is 5."]
#: Greedy in both: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


async def tool_loop_trajectory(codec):
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0))
    async with loop_context(codec, REPLIES, config) as (ctx, loops, _):
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=tuple(QUESTION), tools=("calculator",)))
        return t, [ctx.tool_specs["calculator"].openai()]


async def test_an_agent_through_the_openai_sdk_records_what_the_tool_loop_records(codec):
    expected, tools = await tool_loop_trajectory(codec)
    async with scripted_gateway(codec, REPLIES, GREEDY) as g:
        client = openai.AsyncOpenAI(base_url=g.base_url("s1"), api_key="none")
        first = await client.chat.completions.create(model="m", messages=QUESTION, tools=tools)
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        (tool_call,) = message.tool_calls
        assert tool_call.function.name == "calculator"
        assert json.loads(tool_call.function.arguments) == {"expression": "2+3"}
        history = [*QUESTION, message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
        second = await client.chat.completions.create(model="m", messages=history, tools=tools)
        assert second.choices[0].message.content == "The answer is 5."
        assert second.choices[0].finish_reason == "stop"
        session, (t,) = await g.gateway.finish("s1")
    assert session.forks == []
    assert t.prompt_ids == expected.prompt_ids
    assert t.response_ids == expected.response_ids
    assert t.response_mask == expected.response_mask
    assert t.response_logprobs == expected.response_logprobs
    assert t.weight_versions == expected.weight_versions
    assert t.drift is None and t.assistant_turns == 2 and t.tool_calls == 1
    # the token ids the client got are the engine's, exactly
    assert first.model_extra["agentloop"]["token_ids"] == list(t.response_ids[: len(first.model_extra["agentloop"]
                                                                                   ["token_ids"])])
