"""The OpenAI Responses wire format as pure functions: requests read into the internal shape, every refusal naming
its field, and replies and streams checked against the real openai SDK (its types and, through a MockTransport of
httpx2, the HTTP library it is built on, its own client and stream machinery)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx2
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agentloop_grpc.gateway.config import GatewayLimits
from agentloop_grpc.gateway.exchange import ChatReply, ChatRequest, GatewayError, TextDelta, TokenLogprob
from agentloop_grpc.gateway.openai_responses import OPENAI_RESPONSES, OpenAIResponses
from agentloop_grpc.gateway.reply_events import sse_frames

LIMITS = GatewayLimits()
PNG = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def parse(body: Any, limits: GatewayLimits = LIMITS) -> ChatRequest:
    return OPENAI_RESPONSES.parse(body, limits)


def refused(body: Any, limits: GatewayLimits = LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(body, limits)
    assert caught.value.status == 400
    assert caught.value.kind == "invalid_request"
    return caught.value


def make_reply(**fields: Any) -> ChatReply:
    defaults: dict[str, Any] = {
        "id": "chatcmpl-abc123",
        "model": "agentloop",
        "content": "It is sunny.",
        "tool_calls": (),
        "finish_reason": "stop",
        "token_ids": (11, 12, 13, 2),
        "logprobs": (),
        "prompt_tokens": 40,
        "completion_tokens": 4,
        "cached_prompt_tokens": 32,
        "created": 1_700_000_000,
        "chain": 1,
        "forked": True,
    }
    return ChatReply(**{**defaults, **fields})


CALLS = (
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
)


# --- requests ---


CONVERSATION: dict[str, Any] = {
    "model": "gpt-test",
    "instructions": "Be brief.",
    "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
        {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_3", "output": [{"type": "input_text", "text": "fog"}]},
        {"role": "user", "content": "Thanks."},
    ],
    "tools": [WEATHER, {"type": "function", "name": "noop"}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "max_output_tokens": 64,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_logprobs": 3,
    "stream": True,
    "store": False,
    "parallel_tool_calls": False,
    "metadata": {"run": "7"},
    "user": "u1",
    "truncation": "disabled",
    "include": ["reasoning.encrypted_content"],
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "reasoning": {"effort": None},
    "previous_response_id": None,
}


def test_a_conversation_with_tool_calls_maps_onto_the_internal_shape() -> None:
    request = parse(CONVERSATION)
    assert request.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "fog"},
        {"role": "user", "content": "Thanks."},
    )
    assert request.tools == (
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": WEATHER["parameters"],
            },
        },
        {"type": "function", "function": {"name": "noop"}},
    )
    assert request.tool_choice == {"name": "get_weather"}
    assert (request.max_tokens, request.temperature, request.top_p) == (64, 0.5, 0.9)
    assert (request.logprobs, request.top_logprobs, request.stream, request.model) == (True, 3, True, "gpt-test")


def test_a_string_input_is_one_user_message_with_defaults() -> None:
    request = parse({"input": "Hi"})
    assert request == ChatRequest(messages=({"role": "user", "content": "Hi"},))
    assert parse({"input": "Hi", "include": ["message.output_text.logprobs"]}).logprobs is True
    assert parse({"input": "Hi", "tool_choice": "none", "instructions": ""}).messages == (
        {"role": "user", "content": "Hi"},
    )


def test_a_data_url_image_is_a_part() -> None:
    request = parse(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": PNG, "detail": "auto"},
                    ],
                }
            ]
        }
    )
    assert request.messages == (
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image", "image": PNG}]},
    )


def _image_body(part: dict[str, Any]) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}, part]}]}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        # the body and its top-level fields
        ([1], None, "JSON object"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "send the whole input"),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "store is not supported"),
        ({"input": "x", "background": True}, "background", "false"),
        ({"input": "x", "model": 3}, "model", "a string"),
        ({"input": "x", "instructions": ["a"]}, "instructions", "a string"),
        ({"input": "x", "stream": "yes"}, "stream", "a boolean"),
        ({"input": "x", "store": 1}, "store", "a boolean"),
        ({"input": "x", "user": 5}, "user", "a string"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata", "512"),
        ({"input": "x", "metadata": [1]}, "metadata", "16"),
        ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "[1,"),
        ({"input": "x", "max_output_tokens": True}, "max_output_tokens", "integer"),
        ({"input": "x", "max_output_tokens": 2**40}, "max_output_tokens", "2147483647"),
        ({"input": "x", "temperature": 3}, "temperature", "[0, 2]"),
        ({"input": "x", "temperature": "hot"}, "temperature", "number"),
        ({"input": "x", "temperature": 10**400}, "temperature", "[0, 2]"),
        ({"input": "x", "temperature": float("nan")}, "temperature", "number"),
        ({"input": "x", "top_p": float("inf")}, "top_p", "number"),
        ({"input": "x", "background": 0}, "background", "false"),
        ({"input": "x", "top_p": 0}, "top_p", "(0, 1]"),
        ({"input": "x", "top_logprobs": -1}, "top_logprobs", "max_top_logprobs"),
        ({"input": "x", "include": "all"}, "include", "list of strings"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}},
            "text.format.type",
            "json_schema",
        ),
        ({"input": "x", "text": {"format": {"type": "json_object"}}}, "text.format.type", "json_object"),
        ({"input": "x", "reasoning": "high"}, "reasoning", "object"),
        # input
        ({}, "input", "a string or a list"),
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "empty"),
        ({"input": {"role": "user"}}, "input", "a string or a list"),
        ({"input": ["hi"]}, "input[0]", "an object"),
        ({"input": [{"content": "hi"}]}, "input[0].type", "a type or a role"),
        ({"input": [{"role": "tool", "content": "hi"}]}, "input[0].role", "'tool'"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "a string or a list"),
        ({"input": [{"role": "user", "content": []}]}, "input[0].content", "empty"),
        ({"input": [{"role": "user", "content": ["x"]}]}, "input[0].content[0]", "an object"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "input[0].content[0].text",
            "a string",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
            "input_file",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": PNG}]}]},
            "input[0].content[0].type",
            "assistant",
        ),
        (
            _image_body({"type": "input_image", "image_url": "https://example.com/cat.png"}),
            "input[0].content[1].image_url",
            "no network",
        ),
        (
            _image_body({"type": "input_image", "image_url": "data:text/plain;base64,aGk="}),
            "input[0].content[1].image_url",
            "data URL",
        ),
        (_image_body({"type": "input_image", "file_id": "file_1"}), "input[0].content[1].file_id", "data URL"),
        (_image_body({"type": "input_image"}), "input[0].content[1].image_url", "data URL"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments", "a string"),
        (
            {"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
            "empty",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": 1, "arguments": "{}"}]},
            "input[0].name",
            "a string",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}] * 2},
            "input[1].call_id",
            "earlier function_call",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
            "answers no earlier function_call",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": 3},
                ]
            },
            "input[1].output",
            "a string or a list",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "store is not supported"),
        ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type", "web_search_call"),
        # tools and tool_choice
        ({"input": "x", "tools": {"a": 1}}, "tools", "a list"),
        ({"input": "x", "tools": ["f"]}, "tools[0]", "an object"),
        ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", "letters"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "a string"),
        ({"input": "x", "tools": [WEATHER, WEATHER]}, "tools[1].name", "twice"),
        ({"input": "x", "tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict", "boolean"),
        ({"input": "x", "tools": [{**WEATHER, "description": 4}]}, "tools[0].description", "a string"),
        ({"input": "x", "tools": [{**WEATHER, "parameters": "object"}]}, "tools[0].parameters", "JSON Schema"),
        (
            {"input": "x", "tools": [{**WEATHER, "parameters": {"type": "objekt"}}]},
            "tools[0].parameters",
            "not a valid JSON Schema",
        ),
        (
            {"input": "x", "tools": [{**WEATHER, "parameters": {"$schema": ["x"]}}]},
            "tools[0].parameters.$schema",
            "a string",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}},
            "tool_choice.name",
            "not among",
        ),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "web_search"}}, "tool_choice.type", "web_search"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice", "'sometimes'"),
    ],
)
def test_refusals_name_the_field(body: Any, param: str | None, words: str) -> None:
    error = refused(body)
    assert error.param == param
    assert words in error.message


@pytest.mark.parametrize(
    ("body", "ignored"),
    [
        ({"input": "x", "frequency_penalty": 1}, ("frequency_penalty",)),
        ({"input": "x", "client_metadata": {"thread_id": "t"}}, ("client_metadata",)),
        ({"input": "x", "text": {"other": 1}}, ("text.other",)),
        ({"input": "x", "reasoning": {"summary": "auto", "mode": "x"}}, ("reasoning.mode",)),
        ({"input": "x", "tools": [{"type": "web_search", "external_web_access": False}]}, ("tools[].type=web_search",)),
        ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}, WEATHER]},
         ("tools[].type=file_search",)),
        ({"input": "x", "tools": [{"type": "namespace", "name": "agents", "tools": [WEATHER]}]},
         ("tools[].type=namespace",)),
    ],
)
def test_what_clients_add_is_accepted_and_recorded(body: Any, ignored: tuple[str, ...]) -> None:
    request = parse(body)
    assert request.ignored == ignored
    assert all(t["function"]["name"] == WEATHER["name"] for t in request.tools)


@pytest.mark.parametrize(("reasoning", "thinking"), [
    (None, None), ({"summary": "auto"}, None), ({"effort": "none"}, False), ({"effort": "high"}, True),
])
def test_reasoning_effort_asks_for_the_thinking_mode(reasoning: Any, thinking: bool | None) -> None:
    body = {"input": "x", **({"reasoning": reasoning} if reasoning is not None else {})}
    assert parse(body).thinking is thinking


def test_limits_are_enforced_with_the_bound_named() -> None:
    limits = GatewayLimits(max_messages=2, max_tools=1, max_top_logprobs=5)
    error = refused({"instructions": "s", "input": [{"role": "user", "content": "a"}] * 2}, limits)
    assert (error.param, "limit of 2 (max_messages)" in error.message) == ("input", True)
    assert parse({"input": [{"role": "user", "content": "a"}] * 2}, limits).messages  # two is within
    error = refused({"input": "x", "tools": [WEATHER, {**WEATHER, "name": "b"}]}, limits)
    assert (error.param, "limit of 1 (max_tools)" in error.message) == ("tools", True)
    error = refused({"input": "x", "top_logprobs": 6}, limits)
    assert (error.param, "[0, 5]" in error.message) == ("top_logprobs", True)
    assert parse({"input": "x", "top_logprobs": 5}, limits).top_logprobs == 5


def test_a_deeply_nested_schema_is_refused_not_crashed() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    error = refused({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": schema}]})
    assert error.param == "tools[0].parameters"


HOSTILE: tuple[object, ...] = (
    None, 0, -1, 10**400, 1.5, float("nan"), True, "", "x", "data:", [], [None], {}, {"type": None})


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    nested = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path, *(p for key, item in nested for p in _paths(item, (*path, key)))]


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def test_any_value_anywhere_is_a_request_or_a_refusal() -> None:
    """Every value of a valid body replaced by each hostile one: a ChatRequest or a GatewayError, never a crash."""
    body = {
        **CONVERSATION,
        "input": [*CONVERSATION["input"], _image_body({"type": "input_image", "image_url": PNG})["input"][0]],
    }
    for path in _paths(body):
        for value in HOSTILE:
            try:
                parse(_replaced(body, path, value))
            except GatewayError as error:
                assert error.status == 400 and error.message


# --- replies ---


def test_the_reply_is_an_sdk_response() -> None:
    logprobs = (TokenLogprob(11, "It", -0.1, (("It", -0.1), ("The", -2.5))), TokenLogprob(12, " is", float("-inf")))
    body = OPENAI_RESPONSES.reply(make_reply(tool_calls=CALLS, finish_reason="tool_calls", logprobs=logprobs))
    json.dumps(body, allow_nan=False)  # strict JSON: no -Infinity
    response = Response.model_validate(body)
    assert (response.id, response.object, response.status, response.model) == (
        "resp_abc123",
        "response",
        "completed",
        "agentloop",
    )
    assert response.output_text == "It is sunny."
    message, first, second = response.output
    assert message.type == "message" and message.id == "msg_abc123" and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert message.content[0].logprobs is not None and message.content[0].logprobs[0].top_logprobs[1].token == "The"
    assert first.type == "function_call" and second.type == "function_call"
    assert (first.call_id, first.name, first.arguments, first.status) == (
        "call_1",
        "get_weather",
        '{"city": "Paris"}',
        "completed",
    )
    assert first.id != second.id
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (40, 4, 44)
    assert response.usage.input_tokens_details.cached_tokens == 32
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert response.incomplete_details is None
    assert body["agentloop"] == {"token_ids": [11, 12, 13, 2], "chain": 1, "forked": True}


def test_a_reply_cut_by_length_is_incomplete_and_without_text_has_no_message() -> None:
    response = Response.model_validate(OPENAI_RESPONSES.reply(make_reply(finish_reason="length")))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert message.type == "message" and message.status == "incomplete"
    body = OPENAI_RESPONSES.reply(make_reply(content="", tool_calls=CALLS[:1], finish_reason="tool_calls"))
    assert [item["type"] for item in body["output"]] == ["function_call"]
    assert "logprobs" not in OPENAI_RESPONSES.reply(make_reply())["output"][0]["content"][0]


def _client(content: bytes, content_type: str) -> openai.OpenAI:
    def serve(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/responses"
        return httpx2.Response(200, content=content, headers={"content-type": content_type})

    transport = httpx2.MockTransport(serve)
    return openai.OpenAI(
        api_key="x", base_url="http://gateway/v1", http_client=httpx2.Client(transport=transport), max_retries=0
    )


def test_the_sdk_client_reads_the_reply() -> None:
    body = OPENAI_RESPONSES.reply(make_reply(tool_calls=CALLS, finish_reason="tool_calls"))
    client = _client(json.dumps(body).encode(), "application/json")
    response = client.responses.create(model="agentloop", input="Weather?")
    assert response.output_text == "It is sunny."
    assert [(item.call_id, item.arguments) for item in response.output if item.type == "function_call"] == [
        ("call_1", '{"city": "Paris"}'),
        ("call_2", '{"city": "Oslo"}'),
    ]
    assert response.model_extra is not None and response.model_extra["agentloop"]["chain"] == 1


# --- streams ---


async def _stream(*items: TextDelta | ChatReply | GatewayError) -> AsyncGenerator[TextDelta | ChatReply, None]:
    for item in items:
        if isinstance(item, GatewayError):
            raise item
        yield item


async def _frames(request: ChatRequest, *items: TextDelta | ChatReply | GatewayError) -> list[bytes]:
    stream = b"".join([frame async for frame in sse_frames(OPENAI_RESPONSES.writer(request), _stream(*items))])
    return [frame + b"\n\n" for frame in stream.split(b"\n\n")[:-1]]  # a writer may send several in one write


def _decode(frames: list[bytes]) -> list[dict[str, Any]]:
    events = []
    for frame in frames:
        text = frame.decode()
        assert text.endswith("\n\n")
        head, data = text.strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        events.append(payload)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(event)
    return events


REQUEST = ChatRequest(
    messages=({"role": "user", "content": "Weather?"},),
    tools=({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},),
    tool_choice={"name": "get_weather"},
    temperature=0.2,
    stream=True,
    model="gpt-test",
)


async def test_a_stream_is_sdk_events_in_order() -> None:
    lp = (TokenLogprob(11, "It", -0.1, (("It", -0.1),)),)
    frames = await _frames(
        REQUEST,
        TextDelta("It is ", lp),
        TextDelta("sunny."),
        make_reply(tool_calls=CALLS, finish_reason="tool_calls", logprobs=lp),
    )
    events = _decode(frames)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        *[
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
        * 2,
        "response.completed",
    ]
    assert events[4]["logprobs"] == [
        {"token": "It", "logprob": -0.1, "top_logprobs": [{"token": "It", "logprob": -0.1}]}
    ]
    assert events[10]["delta"] == '{"city": "Paris"}' and events[13]["output_index"] == 2
    final = Response.model_validate(events[-1]["response"])
    assert final.id == events[0]["response"]["id"] and final.status == "completed"
    assert final.output_text == "It is sunny."
    assert final.tool_choice.type == "function" and final.temperature == 0.2
    assert [tool.name for tool in final.tools] == ["get_weather"]
    assert events[-1]["response"]["agentloop"] == {"token_ids": [11, 12, 13, 2], "chain": 1, "forked": True}


async def test_the_sdk_stream_reassembles_text_and_calls() -> None:
    frames = await _frames(
        REQUEST, TextDelta("It is "), TextDelta("sunny."), make_reply(tool_calls=CALLS, finish_reason="tool_calls")
    )
    client = _client(b"".join(frames), "text/event-stream")
    with client.responses.stream(model="gpt-test", input="Weather?") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "It is sunny." == final.output_text
    assert [(item.call_id, item.arguments) for item in final.output if item.type == "function_call"] == [
        ("call_1", '{"city": "Paris"}'),
        ("call_2", '{"city": "Oslo"}'),
    ]
    raw = list(_client(b"".join(frames), "text/event-stream").responses.create(model="m", input="x", stream=True))
    assert raw[-1].type == "response.completed"


async def test_a_stream_with_only_tool_calls_or_cut_by_length() -> None:
    events = _decode(await _frames(REQUEST, make_reply(content="", tool_calls=CALLS[:1], finish_reason="tool_calls")))
    assert [event["type"] for event in events][2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["output_index"] == 0 and events[2]["item"]["type"] == "function_call"
    events = _decode(await _frames(REQUEST, TextDelta("It is"), make_reply(content="It is", finish_reason="length")))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    # text the deltas did not carry still reaches the client, as one delta
    events = _decode(await _frames(REQUEST, make_reply()))
    assert [event["delta"] for event in events if event["type"] == "response.output_text.delta"] == ["It is sunny."]
    client = _client(b"".join(await _frames(REQUEST, make_reply(finish_reason="length"))), "text/event-stream")
    with client.responses.stream(model="gpt-test", input="Weather?") as stream:
        kinds = [event.type for event in stream]
    assert kinds[-1] == "response.incomplete"


async def test_an_error_mid_stream_is_an_error_event_and_the_end() -> None:
    failure = GatewayError("engines failed", status=502, kind="infrastructure")
    events = _decode(await _frames(REQUEST, TextDelta("It"), failure, make_reply()))
    assert events[-2] == {
        "type": "error",
        "code": "infrastructure",
        "message": "engines failed",
        "param": None,
        "sequence_number": len(events) - 2,
    }
    failed = Response.model_validate(events[-1]["response"])
    assert events[-1]["type"] == "response.failed" and failed.status == "failed"
    assert failed.error is not None and (failed.error.code, failed.error.message) == ("server_error", "engines failed")
    assert not any(event["type"] == "response.completed" for event in events)


async def test_an_error_before_the_first_event_is_raised() -> None:
    with pytest.raises(GatewayError, match="paused"):
        await _frames(REQUEST, GatewayError("paused", status=503, kind="unavailable"))


def test_errors_in_openai_shape() -> None:
    fmt = OpenAIResponses()
    assert fmt.name == "responses"
    error = GatewayError("bad", param="input[0].role")
    assert fmt.error(error) == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "input[0].role",
            "code": "invalid_request",
        }
    }
    kinds = {
        ("not_found", 404): "not_found_error",
        ("too_large", 413): "invalid_request_error",
        ("unauthenticated", 401): "authentication_error",
        ("rate_limit", 429): "rate_limit_error",
        ("unavailable", 503): "server_error",
        ("infrastructure", 502): "server_error",
    }
    for (kind, status), expected in kinds.items():
        assert fmt.error(GatewayError("x", status=status, kind=kind))["error"] == {
            "message": "x",
            "type": expected,
            "param": None,
            "code": kind,
        }
