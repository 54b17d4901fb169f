"""The gateway's OpenAI Responses API through the real ``openai`` SDK, on a scripted fake engine: an agent's
conversation (function_call, then the function_call_output turn), streamed or not, is recorded as ONE chain that
holds what our tool loop records for the same conversation; a malformed request is answered in OpenAI's error
shape."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agentloop_grpc.agent import AgentLoopConfig, Sample, SamplingConfig
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from ..agent.conftest import call, loop_context
from .conftest import scripted_gateway

QUESTION = "What is 2 + 3?"
REPLIES = [call("calculator", expression="2+3"), "The answer is 5."]
#: The model writes text before its call: the response holds a message item and a function_call item.
REPLIES_WITH_TEXT = [f"Let me compute that.\n\n{call('calculator', expression='2+3')}", "The answer is 5."]
SCRIPTS = pytest.mark.parametrize("replies", [REPLIES, REPLIES_WITH_TEXT], ids=["call", "text-and-call"])
#: Greedy in both: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


async def tool_loop_trajectory(codec: Any, replies: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """What our tool loop records for the conversation, and its calculator tool as a Responses function tool."""
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0))
    async with loop_context(codec, replies, config) as (ctx, loops, _):
        messages = ({"role": "user", "content": QUESTION},)
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=messages, tools=("calculator",)))
        function = ctx.tool_specs["calculator"].openai()["function"]
    return t, [{"type": "function", "strict": False, **function}]


def assert_records_the_tool_loop(session: Any, t: Any, expected: Any) -> None:
    assert session.forks == []  # the SDK's echo of the output items appended to the chain
    assert t.prompt_ids == expected.prompt_ids
    assert t.response_ids == expected.response_ids
    assert t.response_mask == expected.response_mask  # 1 exactly on the engine's tokens
    assert t.response_logprobs == expected.response_logprobs
    assert t.drift is None and t.assistant_turns == 2 and t.tool_calls == 1


def the_call(output: list[Any], replies: list[str]) -> Any:
    """The response's one function call, after a message item where the model wrote text first."""
    assert [item.type for item in output] == ["message"] * (replies is REPLIES_WITH_TEXT) + ["function_call"]
    (item,) = [item for item in output if item.type == "function_call"]
    assert (item.name, json.loads(item.arguments)) == ("calculator", {"expression": "2+3"})
    return item


def function_call_output_turn(output: list[Any], call_id: str) -> list[Any]:
    """The conversation after the model's call: its output items echoed as the SDK gave them, then the result."""
    return [{"role": "user", "content": QUESTION}, *output,
            {"type": "function_call_output", "call_id": call_id, "output": "5"}]


@SCRIPTS
async def test_an_agent_through_the_responses_api_records_what_the_tool_loop_records(codec, replies):
    expected, tools = await tool_loop_trajectory(codec, replies)
    async with scripted_gateway(codec, replies, GREEDY) as g:
        client = g.openai("s1", max_retries=0)
        first = await client.responses.create(model="m", input=QUESTION, tools=tools)
        assert first.status == "completed"
        item = the_call(first.output, replies)
        second = await client.responses.create(
            model="m", input=function_call_output_turn(first.output, item.call_id), tools=tools)
        assert second.output_text == "The answer is 5." and second.status == "completed"
        assert second.model_extra["agentloop"]["chain"] == 0 and second.model_extra["agentloop"]["forked"] is False
        session, (t,) = await g.gateway.finish("s1")
    assert_records_the_tool_loop(session, t, expected)
    # the token ids the client got are the engine's, exactly
    ids = first.model_extra["agentloop"]["token_ids"]
    assert ids == list(t.response_ids[: len(ids)])


async def streamed(client: openai.AsyncOpenAI, **request: Any) -> tuple[str, Any]:
    """The text deltas of a streamed response, and the response its last event carries."""
    text, final = [], None
    async for event in await client.responses.create(stream=True, **request):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type == "response.completed":
            final = event.response
    assert final is not None
    return "".join(text), final


@SCRIPTS
async def test_the_same_conversation_streamed_records_the_same(codec, replies):
    expected, tools = await tool_loop_trajectory(codec, replies)
    async with scripted_gateway(codec, replies, GREEDY) as g:
        client = g.openai("s2", max_retries=0)
        _, first = await streamed(client, model="m", input=QUESTION, tools=tools)
        item = the_call(first.output, replies)
        text, second = await streamed(
            client, model="m", input=function_call_output_turn(first.output, item.call_id), tools=tools)
        assert text == second.output_text == "The answer is 5."
        session, (t,) = await g.gateway.finish("s2")
    assert_records_the_tool_loop(session, t, expected)


async def test_text_streams_as_it_decodes_with_logprobs(codec):
    async with scripted_gateway(codec, ["Hello there, friend."]) as g:
        client = g.openai("s3", max_retries=0)
        pieces, final = [], None
        async for event in await client.responses.create(model="m", input="Hi", stream=True, top_logprobs=2):
            if event.type == "response.output_text.delta":
                pieces.append(event)
            elif event.type == "response.completed":
                final = event.response
        assert "".join(p.delta for p in pieces) == "Hello there, friend."
        assert len(pieces) >= 2  # it streamed, not one piece at the end
        assert all(len(lp.top_logprobs) == 2 for p in pieces for lp in p.logprobs)
        assert final is not None and final.output_text == "Hello there, friend."
        assert final.usage.output_tokens == len(codec.encode("Hello there, friend.")) + 1  # and the end of turn
        session, (t,) = await g.gateway.finish("s3")
    assert session.forks == [] and t.assistant_turns == 1


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"temperature": 5}, "temperature", "[0, 2]"),
        ({"max_output_tokens": 0}, "max_output_tokens", "[1, 2147483647]"),
        ({"tools": [{"type": "function", "name": "a b", "parameters": {}}]}, "tools[0].name", "letters"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "5"}]}, "input[0].call_id",
         "answers no earlier function_call"),
    ],
)
async def test_a_malformed_request_is_a_bad_request_in_openais_shape(codec, fields, param, words):
    async with scripted_gateway(codec, ["unused"]) as g:
        client = g.openai("s4", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(**{"model": "m", "input": "Hi", **fields})
    error = caught.value
    assert (error.status_code, error.type, error.code, error.param) == (
        400, "invalid_request_error", "invalid_request", param)
    assert words in error.message and param in error.message
    assert g.script.requests == []  # refused before the engine
