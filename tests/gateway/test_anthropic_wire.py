"""The Anthropic Messages wire format as pure functions: requests read into the internal shape (and every refusal
naming its field), replies and streams checked against the real ``anthropic`` SDK's own types, and the SDK itself,
over a mock transport, sending its requests to ``parse`` and reassembling our replies and streams."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from agentloop_grpc.gateway.anthropic_messages import ANTHROPIC_MESSAGES, AnthropicMessages
from agentloop_grpc.gateway.config import GatewayLimits
from agentloop_grpc.gateway.exchange import ChatReply, ChatRequest, GatewayError, TextDelta
from agentloop_grpc.gateway.reply_events import sse_frames

FMT = ANTHROPIC_MESSAGES
LIMITS = GatewayLimits()
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
EVENT = TypeAdapter(RawMessageStreamEvent)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    base.update(fields)
    return base


def refused(request: Any, limits: GatewayLimits = LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        FMT.parse(request, limits)
    error = caught.value
    assert (error.status, error.kind) == (400, "invalid_request")
    return error


def make_reply(**fields: Any) -> ChatReply:
    base: dict[str, Any] = {
        "id": "msg_1",
        "model": "m",
        "content": "Hello.",
        "tool_calls": (),
        "finish_reason": "stop",
        "token_ids": (5, 6, 7),
        "logprobs": (),
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "cached_prompt_tokens": 4,
        "chain": 1,
        "forked": True,
    }
    base.update(fields)
    return ChatReply(**base)


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


async def items(*parts: TextDelta | ChatReply | Exception) -> AsyncGenerator[TextDelta | ChatReply, None]:
    for part in parts:
        if isinstance(part, Exception):
            raise part
        yield part


async def frames(*parts: TextDelta | ChatReply | Exception, request: ChatRequest | None = None) -> list[bytes]:
    request = request or ChatRequest(messages=({"role": "user", "content": "hi"},), model="m", stream=True)
    return _split(b"".join([frame async for frame in sse_frames(FMT.writer(request), items(*parts))]))


def _split(stream: bytes) -> list[bytes]:
    """A stream's bytes as its frames (a writer may send several in one write)."""
    return [frame + b"\n\n" for frame in stream.split(b"\n\n")[:-1]]


def decode(frame: bytes) -> tuple[str, dict[str, Any]]:
    """One SSE frame as (event, data), checking its framing."""
    text = frame.decode()
    assert text.endswith("\n\n")
    head, data = text[:-2].split("\n")
    assert head.startswith("event: ") and data.startswith("data: ")
    return head[len("event: ") :], json.loads(data[len("data: ") :])


def client(handler: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    """The real SDK client, its HTTP answered by ``handler`` (no network)."""
    transport = httpx2.MockTransport(handler)
    return anthropic.Anthropic(
        api_key="k", base_url="http://gateway", max_retries=0, http_client=httpx2.Client(transport=transport)
    )


# --- requests ---


def test_conversation_round_trip_into_the_internal_shape() -> None:
    request = FMT.parse(
        body(
            system=[
                {"type": "text", "text": "You are terse."},
                {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [{"type": "text", "text": "timeout"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
                {"role": "assistant", "content": "Paris 18C."},
            ],
            tools=[WEATHER],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END"],
            stream=True,
            metadata={"user_id": "u"},
            thinking={"type": "disabled"},
        ),
        LIMITS,
    )
    assert request.messages == (
        {"role": "system", "content": "You are terse.\n\nUse tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": [{"type": "text", "text": "Error: timeout"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
        {"role": "assistant", "content": "Paris 18C."},
    )
    assert request.tools == (
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        },
    )
    assert request == ChatRequest(
        messages=request.messages,
        tools=request.tools,
        tool_choice="auto",
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        stop=("END",),
        stream=True,
        model="m",
        thinking=False,
    )


def test_defaults_and_string_forms() -> None:
    request = FMT.parse(body(system="Be kind."), LIMITS)
    assert request == ChatRequest(
        messages=({"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}),
        max_tokens=64,
        model="m",
    )
    assert FMT.parse(body(system=""), LIMITS).messages == ({"role": "user", "content": "hi"},)
    assert FMT.name == "messages" and isinstance(FMT, AnthropicMessages)


def test_tool_results_alone_and_error_forms() -> None:
    messages = FMT.parse(
        body(
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "a", "is_error": True, "content": "boom"},
                        {"type": "tool_result", "tool_use_id": "b", "is_error": True},
                        {"type": "tool_result", "tool_use_id": "c"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "d",
                            "is_error": True,
                            "content": [
                                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
                            ],
                        },
                    ],
                },
            ]
        ),
        LIMITS,
    ).messages
    assert messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert messages[2:] == (
        {"role": "tool", "tool_call_id": "a", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "b", "content": "Error"},
        {"role": "tool", "tool_call_id": "c", "content": ""},
        {
            "role": "tool",
            "tool_call_id": "d",
            "content": [{"type": "text", "text": "Error:"}, {"type": "image", "image": f"data:image/png;base64,{PNG}"}],
        },
    )


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "get_weather"}, {"name": "get_weather"}),
        ({"type": "none"}, "none"),
        ({"type": "any", "disable_parallel_tool_use": False}, "required"),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    assert FMT.parse(body(tools=[WEATHER], tool_choice=choice), LIMITS).tool_choice == expected


def test_images_base64_accepted() -> None:
    request = FMT.parse(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ]
        ),
        LIMITS,
    )
    assert request.messages == (
        {
            "role": "user",
            "content": [
                {"type": "image", "image": f"data:image/png;base64,{PNG}"},
                {"type": "text", "text": "What is this?"},
            ],
        },
    )


@pytest.mark.parametrize(
    ("source", "param", "words"),
    [
        ({"type": "url", "url": "https://example.com/a.png"}, "messages[0].content[0].source", "base64"),
        ({"type": "file", "file_id": "f"}, "messages[0].content[0].source", "fetches nothing"),
        ({"type": "text", "data": "x"}, "messages[0].content[0].source.type", "base64"),
        (
            {"type": "base64", "media_type": "image/tiff", "data": PNG},
            "messages[0].content[0].source.media_type",
            "image/png",
        ),
        (
            {"type": "base64", "media_type": "image/png", "data": "not base64!"},
            "messages[0].content[0].source.data",
            "base64",
        ),
        ({"type": "base64", "media_type": "image/png", "data": ""}, "messages[0].content[0].source.data", "empty"),
        ({"type": "base64", "media_type": "image/png"}, "messages[0].content[0].source.data", "string"),
        ("https://example.com/a.png", "messages[0].content[0].source", "object"),
    ],
)
def test_images_refused(source: Any, param: str, words: str) -> None:
    error = refused(body(messages=[{"role": "user", "content": [{"type": "image", "source": source}]}]))
    assert error.param == param and words in error.message


def _with(**fields: Any) -> dict[str, Any]:
    return body(**fields)


def _message(*content: Any, role: str = "user") -> dict[str, Any]:
    return body(messages=[{"role": role, "content": list(content)}])


TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "ok"}
TOOL_USE = {"type": "tool_use", "id": "t", "name": "f", "input": {}}

REFUSALS: list[tuple[str, Any, str | None, str]] = [
    ("body not an object", [1, 2], None, "object"),
    ("body a string", "hello", None, "object"),
    ("model missing", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model", "string"),
    ("model not a string", _with(model=3), "model", "string"),
    ("max_tokens missing", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "required"),
    ("max_tokens a string", _with(max_tokens="5"), "max_tokens", "integer"),
    ("max_tokens a bool", _with(max_tokens=True), "max_tokens", "integer"),
    ("max_tokens zero", _with(max_tokens=0), "max_tokens", "[1, 2147483647]"),
    ("max_tokens huge", _with(max_tokens=2**40), "max_tokens", "2147483647"),
    ("messages missing", {"model": "m", "max_tokens": 5}, "messages", "array"),
    ("messages an object", _with(messages={"role": "user"}), "messages", "array"),
    ("messages empty", _with(messages=[]), "messages", "at least one"),
    ("message not an object", _with(messages=["hi"]), "messages[0]", "object"),
    ("content missing", _with(messages=[{"role": "user"}]), "messages[0].content", "string or"),
    ("content a number", _with(messages=[{"role": "user", "content": 3}]), "messages[0].content", "string or"),
    ("content empty", _with(messages=[{"role": "user", "content": []}]), "messages[0].content", "at least one"),
    ("block not an object", _message("hi"), "messages[0].content[0]", "object"),
    ("block without type", _message({"text": "hi"}), "messages[0].content[0].type", "string"),
    ("text not a string", _message({"type": "text", "text": 5}), "messages[0].content[0].text", "string"),
    ("document block", _message({"type": "document", "source": {}}), "messages[0].content[0].type", "document"),
    ("tool_use in a user message", _message(TOOL_USE), "messages[0].content[0].type", "assistant message"),
    (
        "tool_result in an assistant message",
        _message(TOOL_RESULT, role="assistant"),
        "messages[0].content[0].type",
        "user message",
    ),
    (
        "image in an assistant message",
        _message({"type": "image", "source": {}}, role="assistant"),
        "messages[0].content[0].type",
        "image",
    ),
    (
        "tool_use without id",
        _message({"type": "tool_use", "name": "f", "input": {}}, role="assistant"),
        "messages[0].content[0].id",
        "string",
    ),
    (
        "tool_use empty name",
        _message({"type": "tool_use", "id": "t", "name": "", "input": {}}, role="assistant"),
        "messages[0].content[0].name",
        "empty",
    ),
    (
        "tool_use input a string",
        _message({"type": "tool_use", "id": "t", "name": "f", "input": "{}"}, role="assistant"),
        "messages[0].content[0].input",
        "object",
    ),
    (
        "tool_result without id",
        _message({"type": "tool_result", "content": "x"}),
        "messages[0].content[0].tool_use_id",
        "string",
    ),
    (
        "tool_result content a number",
        _message({"type": "tool_result", "tool_use_id": "t", "content": 3}),
        "messages[0].content[0].content",
        "string or",
    ),
    (
        "tool_result nested tool_result",
        _message({"type": "tool_result", "tool_use_id": "t", "content": [TOOL_RESULT]}),
        "messages[0].content[0].content[0].type",
        "tool_result",
    ),
    (
        "tool_result is_error a string",
        _message({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}),
        "messages[0].content[0].is_error",
        "boolean",
    ),
    ("system a number", _with(system=3), "system", "array"),
    ("system image block", _with(system=[{"type": "image", "source": {}}]), "system[0].type", "text"),
    ("system text not a string", _with(system=[{"type": "text", "text": None}]), "system[0].text", "string"),
    ("tools an object", _with(tools={"name": "f"}), "tools", "array"),
    ("tool not an object", _with(tools=["f"]), "tools[0]", "object"),
    ("tool without name", _with(tools=[{"input_schema": {"type": "object"}}]), "tools[0].name", "string"),
    ("tool bad name", _with(tools=[{**WEATHER, "name": "get weather"}]), "tools[0].name", "a-zA-Z0-9"),
    ("tool name twice", _with(tools=[WEATHER, WEATHER]), "tools[1].name", "twice"),
    ("tool description a number", _with(tools=[{**WEATHER, "description": 1}]), "tools[0].description", "string"),
    ("tool without input_schema", _with(tools=[{"name": "f"}]), "tools[0].input_schema", "object"),
    ("input_schema a string", _with(tools=[{"name": "f", "input_schema": "{}"}]), "tools[0].input_schema", "object"),
    (
        "input_schema not of an object",
        _with(tools=[{"name": "f", "input_schema": {"type": "string"}}]),
        "tools[0].input_schema.type",
        "object",
    ),
    (
        "input_schema not compiling",
        _with(tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}]),
        "tools[0].input_schema",
        "not a valid",
    ),
    ("tool_choice a string", _with(tools=[WEATHER], tool_choice="auto"), "tool_choice", "object"),
    ("tool_choice unknown type", _with(tools=[WEATHER], tool_choice={"type": "all"}), "tool_choice.type", "auto"),
    (
        "tool_choice tool unknown",
        _with(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}),
        "tool_choice.name",
        "not one of",
    ),
    ("tool_choice tool nameless", _with(tools=[WEATHER], tool_choice={"type": "tool"}), "tool_choice.name", "string"),
    ("tool_choice any without tools", _with(tool_choice={"type": "any"}), "tool_choice", "needs tools"),
    (
        "disable_parallel_tool_use a string",
        _with(tool_choice={"type": "auto", "disable_parallel_tool_use": "yes"}),
        "tool_choice.disable_parallel_tool_use",
        "boolean",
    ),
    ("temperature a string", _with(temperature="0.5"), "temperature", "number"),
    ("temperature above 1", _with(temperature=1.5), "temperature", "[0, 1]"),
    ("temperature NaN", _with(temperature=float("nan")), "temperature", "[0, 1]"),
    ("top_p zero", _with(top_p=0), "top_p", "(0, 1]"),
    ("top_k negative", _with(top_k=-1), "top_k", "[0, 2147483647]"),
    ("top_k a float", _with(top_k=1.5), "top_k", "integer"),
    ("stop_sequences a string", _with(stop_sequences="END"), "stop_sequences", "array"),
    ("stop sequence a number", _with(stop_sequences=["a", 1]), "stop_sequences[1]", "string"),
    ("stop sequence empty", _with(stop_sequences=[""]), "stop_sequences[0]", "empty"),
    ("stream a string", _with(stream="true"), "stream", "boolean"),
    ("metadata a string", _with(metadata="u"), "metadata", "object"),
    ("thinking a bool", _with(thinking=True), "thinking", "object"),
    ("container", _with(container="c"), "container", "server tools"),
    ("service_tier a number", _with(service_tier=1), "service_tier", "string"),
    ("cache_control a string", _with(cache_control="ephemeral"), "cache_control", "object"),
    (
        "output_config format",
        _with(output_config={"format": {"type": "json_schema", "schema": {}}}),
        "output_config.format",
        "not supported",
    ),
    ("output_config effort a number", _with(output_config={"effort": 3}), "output_config.effort", "string"),
]


#: What real clients send that the gateway accepts and records as ignored (Claude Code's own bodies are in
#: test_client_bodies.py): the request, and the names recorded.
TOLERATED: list[tuple[str, Any, tuple[str, ...]]] = [
    ("unknown top-level field", _with(context_management={"edits": []}), ("context_management",)),
    ("message extra key", _with(messages=[{"role": "user", "content": "x", "name": "n"}]), ("messages[].name",)),
    ("thinking block", _message({"type": "thinking", "thinking": "..", "signature": "s"}, role="assistant"),
     ("messages[].content[].type=thinking",)),
    ("server tool", _with(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
     ("tools[].type=web_search_20250305",)),
    ("bash tool", _with(tools=[{"type": "bash_20250124", "name": "bash"}]), ("tools[].type=bash_20250124",)),
    ("deferred tool", _with(tools=[{**WEATHER, "defer_loading": True}]), ("tools[].defer_loading",)),
    ("tool unknown key", _with(tools=[{**WEATHER, "eager_input_streaming": True}]),
     ("tools[].eager_input_streaming",)),
    ("tool_choice extra key", _with(tools=[WEATHER], tool_choice={"type": "auto", "x": 1}), ("tool_choice.x",)),
    ("output_config unknown key", _with(output_config={"verbosity": 1}), ("output_config.verbosity",)),
    ("thinking adaptive", _with(thinking={"type": "adaptive", "display": "omitted"}), ()),
]


@pytest.mark.parametrize(("request_body", "ignored"), [r[1:] for r in TOLERATED], ids=[r[0] for r in TOLERATED])
def test_what_clients_add_is_accepted_and_recorded(request_body: Any, ignored: tuple[str, ...]) -> None:
    request = FMT.parse(request_body, LIMITS)
    assert request.ignored == ignored
    assert not any(t["function"]["name"] in ("web_search", "bash") for t in request.tools)


def test_a_hosted_or_deferred_tool_is_left_out_and_the_others_kept() -> None:
    request = FMT.parse(_with(tools=[{"type": "web_search_20250305", "name": "web_search"}, WEATHER,
                                     {**WEATHER, "name": "later", "defer_loading": True}]), LIMITS)
    assert [t["function"]["name"] for t in request.tools] == ["get_weather"]
    assert request.ignored == ("tools[].type=web_search_20250305", "tools[].defer_loading")


def test_a_system_message_among_the_messages_stays_where_it_is() -> None:
    request = FMT.parse(_with(system="first", messages=[
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "env", "cache_control": {"type": "ephemeral"}}],
         "output_config": {"effort": "medium"}},
    ]), LIMITS)
    assert [m["role"] for m in request.messages] == ["system", "user", "system"]
    assert request.messages[2]["content"] == "env"
    assert request.ignored == ("messages[].output_config",)


@pytest.mark.parametrize(("thinking", "expected"), [
    (None, None), ({"type": "disabled"}, False), ({"type": "enabled", "budget_tokens": 1024}, True),
    ({"type": "adaptive"}, True),
])
def test_thinking_asks_for_the_thinking_mode(thinking: Any, expected: bool | None) -> None:
    request = FMT.parse(_with(**({} if thinking is None else {"thinking": thinking})), LIMITS)
    assert request.thinking is expected


@pytest.mark.parametrize(("request_body", "param", "words"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_field(request_body: Any, param: str | None, words: str) -> None:
    error = refused(request_body)
    assert error.param == param
    assert words in error.message
    if param is not None:
        assert param.split("[")[0].split(".")[0] in error.message


def test_deep_input_schema_is_refused_not_a_crash() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(40):  # 80 levels: jsonschema's own check would recurse past the stack at a few hundred
        schema = {"type": "object", "properties": {"a": schema}}
    error = refused(body(tools=[{"name": "f", "input_schema": schema}]))
    assert error.param == "tools[0].input_schema" and "64" in error.message
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}}
    assert refused(body(tools=[{"name": "f", "input_schema": schema}])).param == "tools[0].input_schema"


def test_limits_name_the_field_and_the_bound() -> None:
    limits = GatewayLimits(max_messages=2, max_tools=1, max_stop=1)
    error = refused(body(messages=[{"role": "user", "content": "x"}] * 3), limits)
    assert (error.param, "2" in error.message, "3" in error.message) == ("messages", True, True)
    error = refused(body(tools=[WEATHER, {**WEATHER, "name": "other"}]), limits)
    assert error.param == "tools" and "limit of 1" in error.message
    error = refused(body(stop_sequences=["a", "b"]), limits)
    assert error.param == "stop_sequences" and "limit of 1" in error.message
    ok = FMT.parse(body(messages=[{"role": "user", "content": "x"}] * 2, tools=[WEATHER], stop_sequences=["a"]), limits)
    assert len(ok.messages) == 2


def test_the_sdk_requests_parse() -> None:
    """What the real SDK sends (its own serialisation of typed params) is read, and our reply is its Message."""
    seen: list[ChatRequest] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/messages"
        seen.append(FMT.parse(json.loads(request.content), LIMITS))
        reply = make_reply(content="", tool_calls=(CALL,), finish_reason="tool_calls")
        return httpx2.Response(200, json=FMT.reply(reply))

    message = client(handler).messages.create(
        model="m",
        max_tokens=32,
        system="sys",
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "-3C"}]},
        ],
        metadata={"user_id": "u1"},
        stop_sequences=["\n\n"],
        service_tier="auto",
        speed="standard",
        cache_control={"type": "ephemeral"},
        output_config={"effort": "low"},
        extra_body={"temperature": 0.0, "top_k": 5},
    )
    assert seen[0].tool_choice == {"name": "get_weather"} and seen[0].stop == ("\n\n",)
    assert seen[0].temperature == 0.0
    assert seen[0].messages[-1] == {"role": "tool", "tool_call_id": "t1", "content": "-3C"}
    assert message.stop_reason == "tool_use"
    assert message.content[0].type == "tool_use" and message.content[0].input == {"city": "Paris"}


# --- replies ---


def test_reply_is_an_sdk_message() -> None:
    reply = make_reply(tool_calls=(CALL,), finish_reason="tool_calls")
    data = FMT.reply(reply)
    message = Message.model_validate(data)
    assert data["content"] == [
        {"type": "text", "text": "Hello."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert (message.id, message.model, message.role, message.stop_reason) == ("msg_1", "m", "assistant", "tool_use")
    assert message.usage.input_tokens == 6 and message.usage.cache_read_input_tokens == 4
    assert message.usage.output_tokens == 3
    assert data["agentloop"] == {"token_ids": [5, 6, 7], "chain": 1, "forked": True}
    assert message.model_extra == {"agentloop": data["agentloop"]}


@pytest.mark.parametrize(
    ("finish", "stop_reason"), [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use")]
)
def test_reply_stop_reasons(finish: Any, stop_reason: str) -> None:
    data = FMT.reply(make_reply(finish_reason=finish))
    assert data["stop_reason"] == stop_reason and data["stop_sequence"] is None


def test_reply_empty_content_has_no_text_block() -> None:
    data = FMT.reply(make_reply(content=""))
    assert data["content"] == [] and Message.model_validate(data).content == []


# --- streams ---


async def test_stream_events_are_sdk_events() -> None:
    reply = make_reply(content="Hello, world", tool_calls=(CALL,), finish_reason="tool_calls")
    got = await frames(TextDelta("Hello"), TextDelta(""), TextDelta(", world"), reply)
    decoded = [decode(f) for f in got]
    for name, data in decoded:
        assert data["type"] == name
        EVENT.validate_python(data)
    assert [name for name, _ in decoded] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert decoded[0][1]["message"]["model"] == "m" and decoded[0][1]["message"]["id"].startswith("msg_")
    assert decoded[5][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
    }
    assert json.loads(decoded[6][1]["delta"]["partial_json"]) == {"city": "Paris"}
    delta = decoded[8][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3
    assert delta["agentloop"] == {"token_ids": [5, 6, 7], "chain": 1, "forked": True}


async def test_the_sdk_reassembles_the_stream() -> None:
    reply = make_reply(
        content="Hi there",
        tool_calls=(
            CALL,
            {**CALL, "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "C"}'}},
        ),
        finish_reason="tool_calls",
    )
    body_bytes = b"".join(await frames(TextDelta("Hi"), TextDelta(" there"), reply))

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert FMT.parse(json.loads(request.content), LIMITS).stream is True
        return httpx2.Response(200, content=body_bytes, headers={"content-type": "text/event-stream"})

    with client(handler).messages.stream(
        model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Hi there"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}
    assert message.content[2].input == {"city": "Rome", "unit": "C"}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (6, 3)


async def test_stream_text_only_in_the_final_reply() -> None:
    """A turn offered tools streams no deltas: its text comes with the ChatReply."""
    decoded = [decode(f) for f in await frames(make_reply(content="Done."))]
    assert [d["type"] for _, d in decoded] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert decoded[2][1]["delta"] == {"type": "text_delta", "text": "Done."}
    assert decoded[4][1]["delta"]["stop_reason"] == "end_turn"


async def test_stream_empty_reply_has_no_blocks() -> None:
    decoded = [decode(f) for f in await frames(make_reply(content="", finish_reason="length"))]
    assert [d["type"] for _, d in decoded] == ["message_start", "message_delta", "message_stop"]
    assert decoded[1][1]["delta"]["stop_reason"] == "max_tokens"


async def test_stream_error_before_the_first_event_is_raised() -> None:
    with pytest.raises(GatewayError, match="busy"):
        await frames(GatewayError("busy", status=503, kind="unavailable"))


async def test_stream_error_after_start_is_an_error_event() -> None:
    got = await frames(TextDelta("Hel"), GatewayError("engines failed", status=502, kind="infrastructure"))
    decoded = [decode(f) for f in got]
    assert [name for name, _ in decoded] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert decoded[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "engines failed"}}
    ErrorResponse.model_validate(decoded[-1][1])

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"".join(got), headers={"content-type": "text/event-stream"})

    with pytest.raises(anthropic.APIStatusError, match="engines failed"):
        with client(handler).messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            stream.until_done()


# --- errors ---


@pytest.mark.parametrize(
    ("kind", "status", "error_type"),
    [
        ("invalid_request", 400, "invalid_request_error"),
        ("not_found", 404, "not_found_error"),
        ("too_large", 413, "request_too_large"),
        ("rate_limit", 429, "rate_limit_error"),
        ("unavailable", 503, "overloaded_error"),
        ("infrastructure", 502, "api_error"),
        ("something new", 500, "api_error"),
    ],
)
def test_error_shape(kind: str, status: int, error_type: str) -> None:
    data = FMT.error(GatewayError("why", status=status, kind=kind, param="p"))
    assert data == {"type": "error", "error": {"type": error_type, "message": "why"}}
    if error_type != "request_too_large":  # Anthropic's documented 413 type, absent from the SDK's union
        ErrorResponse.model_validate(data)


def test_parse_errors_round_trip_to_error_bodies() -> None:
    error = refused(body(max_tokens=0))
    assert FMT.error(error)["error"]["type"] == "invalid_request_error"
