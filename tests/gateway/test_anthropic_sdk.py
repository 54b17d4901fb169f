"""The gateway's Anthropic Messages through the real ``anthropic`` SDK, on a scripted fake engine: an agent's
conversation (tool_use, then the tool_result turn), streamed or not, is recorded as ONE chain that holds what our
tool loop records for the same conversation; a malformed request is answered in Anthropic's error shape."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from agentloop_grpc.agent import AgentLoopConfig, Sample, SamplingConfig
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from ..agent.conftest import call, loop_context
from .conftest import scripted_gateway

QUESTION = "What is 2 + 3?"
REPLIES = [call("calculator", expression="2+3"), "The answer is 5."]
#: The model writes text before its call: the SDK echoes a text block and a tool_use block.
REPLIES_WITH_TEXT = [f"Let me compute that.\n\n{call('calculator', expression='2+3')}", "The answer is 5."]
SCRIPTS = pytest.mark.parametrize("replies", [REPLIES, REPLIES_WITH_TEXT], ids=["call", "text-and-call"])
#: Greedy in both: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


async def tool_loop_trajectory(codec: Any, replies: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """What our tool loop records for the conversation, and its calculator tool as an Anthropic tool."""
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0))
    async with loop_context(codec, replies, config) as (ctx, loops, _):
        messages = ({"role": "user", "content": QUESTION},)
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=messages, tools=("calculator",)))
        function = ctx.tool_specs["calculator"].openai()["function"]
    tool = {"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}
    return t, [tool]


def assert_records_the_tool_loop(session: Any, t: Any, expected: Any) -> None:
    assert session.forks == []  # the SDK's echo of the assistant turn appended to the chain
    assert t.prompt_ids == expected.prompt_ids
    assert t.response_ids == expected.response_ids
    assert t.response_mask == expected.response_mask  # 1 exactly on the engine's tokens
    assert t.response_logprobs == expected.response_logprobs
    assert t.drift is None and t.assistant_turns == 2 and t.tool_calls == 1


def tool_result_turn(content: list[Any], tool_use_id: str) -> list[dict[str, Any]]:
    """The conversation after the model's tool_use turn: its content echoed as the SDK gave it, then the result."""
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "5"}]},
    ]


@SCRIPTS
async def test_an_agent_through_the_anthropic_sdk_records_what_the_tool_loop_records(codec, replies):
    expected, tools = await tool_loop_trajectory(codec, replies)
    async with scripted_gateway(codec, replies, GREEDY) as g:
        client = g.anthropic("s1", max_retries=0)
        first = await client.messages.create(
            model="m", max_tokens=256, messages=[{"role": "user", "content": QUESTION}], tools=tools)
        assert first.stop_reason == "tool_use"
        assert [block.type for block in first.content] == ["text"] * (replies is REPLIES_WITH_TEXT) + ["tool_use"]
        (tool_use,) = [block for block in first.content if block.type == "tool_use"]
        assert (tool_use.name, tool_use.input) == ("calculator", {"expression": "2+3"})
        second = await client.messages.create(
            model="m", max_tokens=256, messages=tool_result_turn(first.content, tool_use.id), tools=tools)
        assert [block.type for block in second.content] == ["text"]
        assert second.content[0].text == "The answer is 5." and second.stop_reason == "end_turn"
        assert second.model_extra["agentloop"]["chain"] == 0 and second.model_extra["agentloop"]["forked"] is False
        session, (t,) = await g.gateway.finish("s1")
    assert_records_the_tool_loop(session, t, expected)
    # the token ids the client got are the engine's, exactly
    ids = first.model_extra["agentloop"]["token_ids"]
    assert ids == list(t.response_ids[: len(ids)])


@SCRIPTS
async def test_the_same_conversation_streamed_records_the_same(codec, replies):
    expected, tools = await tool_loop_trajectory(codec, replies)
    async with scripted_gateway(codec, replies, GREEDY) as g:
        client = g.anthropic("s2", max_retries=0)
        async with client.messages.stream(
                model="m", max_tokens=256, messages=[{"role": "user", "content": QUESTION}], tools=tools) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use"
        assert [block.type for block in first.content] == ["text"] * (replies is REPLIES_WITH_TEXT) + ["tool_use"]
        (tool_use,) = [block for block in first.content if block.type == "tool_use"]
        assert (tool_use.name, tool_use.input) == ("calculator", {"expression": "2+3"})
        async with client.messages.stream(
                model="m", max_tokens=256, messages=tool_result_turn(first.content, tool_use.id),
                tools=tools) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            second = await stream.get_final_message()
        assert text == "The answer is 5." and second.stop_reason == "end_turn"
        session, (t,) = await g.gateway.finish("s2")
    assert_records_the_tool_loop(session, t, expected)


async def test_text_streams_as_it_decodes(codec):
    async with scripted_gateway(codec, ["Hello there, friend."]) as g:
        client = g.anthropic("s3", max_retries=0)
        async with client.messages.stream(
                model="m", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as stream:
            pieces = [piece async for piece in stream.text_stream]
            message = await stream.get_final_message()
        assert "".join(pieces) == "Hello there, friend." and len(pieces) >= 2  # it streamed, not one piece at the end
        assert message.usage.output_tokens == len(codec.encode("Hello there, friend.")) + 1  # and the end of turn
        assert g.gateway.router.live_sessions == 1
        session, (t,) = await g.gateway.finish("s3")
        assert g.gateway.router.live_sessions == 0  # a finished session leaves nothing in the Router
    assert session.forks == [] and t.assistant_turns == 1


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"max_tokens": 0}, "max_tokens", "[1, 2147483647]"),
        ({"extra_body": {"top_k": -1}}, "top_k", "[0, 2147483647]"),
        ({"tools": [{"name": "get weather", "input_schema": {"type": "object"}}]}, "tools[0].name", "a-zA-Z0-9"),
    ],
)
async def test_a_malformed_request_is_a_bad_request_in_anthropics_shape(codec, fields, param, words):
    async with scripted_gateway(codec, ["unused"]) as g:
        client = g.anthropic("s4", max_retries=0)
        request: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(**{**request, **fields})
    error = caught.value
    assert error.status_code == 400
    assert error.body["type"] == "error" and error.body["error"]["type"] == "invalid_request_error"
    message = error.body["error"]["message"]
    assert param in message and words in message and message in str(error)
    assert g.script.requests == []  # refused before the engine

