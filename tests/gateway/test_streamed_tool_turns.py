"""A streamed turn offered tools sends the text before its call as it decodes, in each API through its real SDK,
before the call; the deltas add up to the reply's content, so the history a client rebuilds from the stream
appends to its chain (the Responses and Anthropic SDK tests check that for their echo of the turn)."""

from __future__ import annotations

import json

from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam

from ..agent.conftest import call
from .conftest import scripted_gateway

TEXT = "Let me add those two numbers for you."
REPLIES = [f"{TEXT}\n\n{call('calculator', expression='1+1')}", "It is 2."]
QUESTION = [{"role": "user", "content": "What is 1 + 1?"}]
PARAMETERS: dict[str, object] = {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
TOOL: ChatCompletionFunctionToolParam = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic.", "parameters": PARAMETERS}}


def assert_text_streamed_first(events: list[tuple[str, str]]) -> None:
    """``events``: ("text", piece) and ("call", name) in the order they came."""
    pieces = [piece for kind, piece in events if kind == "text"]
    assert "".join(pieces) == TEXT, events
    assert len(pieces) >= 2, events  # as it decoded, not in one piece once the call was parsed
    assert [kind for kind, _ in events] == ["text"] * len(pieces) + ["call"], events


async def test_chat_completions_stream_the_text_before_the_call_and_the_rebuilt_history_appends(codec):
    async with scripted_gateway(codec, REPLIES) as g:
        client = g.openai("chat", max_retries=0)
        events, calls = [], []
        async for chunk in await client.chat.completions.create(model="m", messages=QUESTION, stream=True,
                                                                tools=[TOOL]):
            for choice in chunk.choices:
                if choice.delta.content:
                    events.append(("text", choice.delta.content))
                for c in choice.delta.tool_calls or []:
                    events.append(("call", c.function.name))
                    calls.append({"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}})
        assert_text_streamed_first(events)
        assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "1+1"}
        rebuilt = {"role": "assistant", "content": "".join(piece for kind, piece in events if kind == "text"),
                   "tool_calls": calls}
        history = [*QUESTION, rebuilt, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "2"}]
        second = await client.chat.completions.create(model="m", messages=history, tools=[TOOL])
        assert second.choices[0].message.content == "It is 2."
        session, (t,) = await g.gateway.finish("chat")
    assert session.forks == [] and t.assistant_turns == 2 and t.tool_calls == 1


async def test_responses_stream_the_text_before_the_call(codec):
    async with scripted_gateway(codec, REPLIES) as g:
        client = g.openai("responses", max_retries=0)
        events, final = [], None
        tool: FunctionToolParam = {"type": "function", "strict": False, "name": "calculator",
                                   "description": "Evaluate arithmetic.", "parameters": PARAMETERS}
        async for event in await client.responses.create(model="m", input=QUESTION, stream=True, tools=[tool]):
            if event.type == "response.output_text.delta":
                events.append(("text", event.delta))
            elif event.type == "response.output_item.added" and event.item.type == "function_call":
                events.append(("call", event.item.name))
            elif event.type == "response.completed":
                final = event.response
        assert_text_streamed_first(events)
        assert final is not None and final.output_text == TEXT
        assert [item.type for item in final.output] == ["message", "function_call"]


async def test_anthropic_messages_stream_the_text_before_the_call(codec):
    async with scripted_gateway(codec, REPLIES) as g:
        client = g.anthropic("messages", max_retries=0)
        tool: ToolParam = {"name": "calculator", "description": "Evaluate arithmetic.", "input_schema": PARAMETERS}
        events = []
        async with client.messages.stream(model="m", max_tokens=256, messages=QUESTION, tools=[tool]) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    events.append(("text", event.delta.text))
                elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                    events.append(("call", event.content_block.name))
            message = await stream.get_final_message()
        assert_text_streamed_first(events)
        assert [block.type for block in message.content] == ["text", "tool_use"]
        assert message.content[0].text == TEXT and message.stop_reason == "tool_use"
