"""Anthropic's Messages API (``POST /v1/messages``) as a WireFormat: its request read into the gateway's ChatRequest,
a ChatReply written as its ``Message``, a stream as its server-sent events, an error in its error shape.

Reading a request. Anthropic's API refuses what it does not know, so this does too: an unknown top-level field, an
unknown content block type or a message key beyond ``role``/``content`` is a 400 naming the field. A hostile client
may send any JSON value, so every field is type-checked before it is used, and every error is a GatewayError with
``param`` set to the field's path (``messages[3].content[0].source``). Anthropic blocks map onto the internal
(OpenAI-chat-shaped) messages of ``exchange.py``:

- ``system`` (a string or text blocks) becomes one leading system message, its blocks joined by a blank line (chat
  templates want a system message's content as a string);
- a user message's ``tool_result`` blocks become ``tool`` messages, in order and before the rest of that user
  message (text and images), which follows them as a user message; ``is_error`` prefixes the result with "Error: ",
  as the model must read it as a failure without a field of its own;
- an assistant message's text blocks become its content (joined) and its ``tool_use`` blocks its ``tool_calls``;
- an image must be base64 (the gateway has no network, so ``url`` and ``file`` sources are refused) and becomes a
  data URL;
- tools become OpenAI function specs; server tools (a ``type`` other than ``custom``) are refused by name;
- ``top_k`` is checked and ignored (ChatRequest has no top_k: the gateway's sampling is the run's, not the
  agent's); so are ``disable_parallel_tool_use``, ``cache_control`` markers, ``output_config.effort`` and the
  fields of ``_IGNORED`` (metadata, service tier, region...), none of which changes what the model writes;
  ``thinking`` is refused unless disabled (a thinking block would need a signature the gateway cannot make), and so
  is ``output_config.format`` (the gateway does not constrain a reply to a schema) and ``container`` (no server
  tools).

Writing a reply. ``usage.input_tokens`` counts the prompt tokens not read from the prefix cache, as Anthropic's
does (its total is input + cache read + cache creation). The engine's token ids ride in a top-level ``agentloop``
object (in ``message_delta`` when streamed), which Anthropic's clients keep as an unknown field. A finish on a stop
string is reported as ``end_turn``: ChatReply does not say which stop string matched.

Streaming. Nothing is written before the first item of the stream arrives, so an error the gateway raises before
the turn starts is an HTTP error, not an event. TextDeltas become one text block as they come; the final ChatReply
closes it (adding what of ``content`` was not streamed) and adds a block per tool call, its input sent whole as one
``input_json_delta``. The message id is made here (``msg_...``), as the stream's id is needed before the ChatReply
carrying the gateway's id arrives.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jsonschema

from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, FinishReason, GatewayError, TextDelta, ToolChoice
from .wire import sse

#: The top-level fields of a Messages request this format reads.
_FIELDS = frozenset(
    "model max_tokens system messages tools tool_choice temperature top_p top_k stop_sequences stream thinking "
    "output_config".split()
)
#: Fields accepted and ignored, with the JSON type each must have: where and how Anthropic would serve the request
#: (tier, region, speed, workspace), its prompt-cache hints and request labels; none changes what the model writes.
_IGNORED: dict[str, type] = {
    "metadata": dict,
    "cache_control": dict,
    "diagnostics": dict,
    "service_tier": str,
    "speed": str,
    "inference_geo": str,
    "user_profile_id": str,
    "workspace_id": str,
}
#: The keys a custom tool may have (``cache_control`` and ``strict`` are accepted and ignored).
_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict"})
#: Anthropic's image types.
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: Anthropic's rule for a tool name.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
#: Nesting of a tool's input_schema (real ones nest a few levels): jsonschema's check recurses several frames a
#: level, so a deeper schema could exhaust the stack instead of being refused.
_MAX_SCHEMA_DEPTH = 64
#: Well beyond any context: bounds an integer a client sends before it meets the gateway's own caps.
_MAX_INT = 2**31 - 1

_STOP_REASONS: dict[FinishReason, str] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
#: GatewayError.kind -> Anthropic's error type (an unknown kind is the server's fault: api_error).
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "unavailable": "overloaded_error",
    "infrastructure": "api_error",
}


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _fail(message: str, param: str | None) -> GatewayError:
    return GatewayError(message, status=400, kind="invalid_request", param=param)


def _type_name(value: Any) -> str:
    """A JSON value's type as a client would name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{param} must be an object, not {_type_name(value)}", param)
    return value


def _array(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(f"{param} must be an array, not {_type_name(value)}", param)
    return value


def _string(value: Any, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _fail(f"{param} must be a string, not {_type_name(value)}", param)
    if not empty and not value:
        raise _fail(f"{param} must not be empty", param)
    return value


def _integer(value: Any, param: str, low: int, high: int = _MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{param} must be an integer, not {_type_name(value)}", param)
    if not low <= value <= high:
        raise _fail(f"{param} must be between {low} and {high}, got {value}", param)
    return value


def _number(value: Any, param: str, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(f"{param} must be a number, not {_type_name(value)}", param)
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _fail(f"{param} must be in {interval}, got {value}", param)
    return number


def _block(value: Any, param: str) -> tuple[dict[str, Any], str]:
    """A content block and its type."""
    block = _object(value, param)
    return block, _string(block.get("type"), f"{param}.type")


def _text_block(block: dict[str, Any], param: str) -> str:
    return _string(block.get("text"), f"{param}.text")


def _image_part(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = _object(block.get("source"), f"{param}.source")
    where = f"{param}.source"
    kind = _string(source.get("type"), f"{where}.type")
    if kind in ("url", "file"):
        raise _fail(
            f"{where}: {kind} image sources are not supported (the gateway fetches nothing); send the image as base64",
            where,
        )
    if kind != "base64":
        raise _fail(f"{where}.type must be base64, got {kind!r}", f"{where}.type")
    media_type = _string(source.get("media_type"), f"{where}.media_type")
    if media_type not in _IMAGE_TYPES:
        raise _fail(
            f"{where}.media_type must be one of {', '.join(sorted(_IMAGE_TYPES))}, got {media_type!r}",
            f"{where}.media_type",
        )
    data = _string(source.get("data"), f"{where}.data", empty=False)
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise _fail(f"{where}.data is not valid base64 ({error})", f"{where}.data") from None
    return {"type": "image", "image": f"data:{media_type};base64,{data}"}


def _parts(blocks: list[Any], param: str) -> list[dict[str, Any]]:
    """Text and image blocks (a user message's rest or a tool result's content) as internal parts."""
    parts: list[dict[str, Any]] = []
    for i, value in enumerate(blocks):
        where = f"{param}[{i}]"
        block, kind = _block(value, where)
        if kind not in ("text", "image"):
            raise _fail(f"{where}.type {kind!r} is not supported here (text or image)", f"{where}.type")
        parts.append(_part(block, kind, where))
    return parts


def _system(value: Any) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for i, item in enumerate(_array(value, "system")):
        where = f"system[{i}]"
        block, kind = _block(item, where)
        if kind != "text":
            raise _fail(f"{where}.type must be text, got {kind!r}", f"{where}.type")
        texts.append(_text_block(block, where))
    return "\n\n".join(texts)


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(block.get("tool_use_id"), f"{param}.tool_use_id", empty=False)
    raw = block.get("content", "")
    content: str | list[dict[str, Any]]
    if isinstance(raw, str):
        content = raw
    elif isinstance(raw, list):
        content = _parts(raw, f"{param}.content")
    else:
        raise _fail(
            f"{param}.content must be a string or an array of blocks, not {_type_name(raw)}", f"{param}.content"
        )
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _fail(f"{param}.is_error must be a boolean, not {_type_name(is_error)}", f"{param}.is_error")
    if is_error:
        if isinstance(content, str):
            content = f"Error: {content}" if content else "Error"
        elif content and content[0]["type"] == "text":
            content = [{"type": "text", "text": f"Error: {content[0]['text']}"}, *content[1:]]
        else:
            content = [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tool_call(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(block.get("id"), f"{param}.id", empty=False)
    name = _string(block.get("name"), f"{param}.name", empty=False)
    arguments = _object(block.get("input"), f"{param}.input")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _user(content: str | list[Any], param: str) -> list[dict[str, Any]]:
    """One Anthropic user message: its tool results first, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    rest: list[Any] = []
    for i, value in enumerate(content):
        where = f"{param}[{i}]"
        block, kind = _block(value, where)
        if kind == "tool_result":
            results.append(_tool_result(block, where))
        elif kind in ("text", "image"):
            rest.append(_part(block, kind, where))
        elif kind == "tool_use":
            raise _fail(f"{where}: a tool_use block belongs in an assistant message", f"{where}.type")
        else:
            raise _fail(
                f"{where}.type {kind!r} is not supported in a user message (text, image, tool_result)", f"{where}.type"
            )
    return results + ([{"role": "user", "content": rest}] if rest else [])


def _part(block: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text", "text": _text_block(block, param)}
    return _image_part(block, param)


def _assistant(content: str | list[Any], param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, value in enumerate(content):
        where = f"{param}[{i}]"
        block, kind = _block(value, where)
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        elif kind == "tool_result":
            raise _fail(f"{where}: a tool_result block belongs in a user message", f"{where}.type")
        elif kind in ("thinking", "redacted_thinking"):
            raise _fail(
                f"{where}: {kind} blocks are not supported (the gateway serves no extended thinking)", f"{where}.type"
            )
        else:
            raise _fail(
                f"{where}.type {kind!r} is not supported in an assistant message (text, tool_use)", f"{where}.type"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(value: Any, limits: GatewayLimits) -> list[dict[str, Any]]:
    items = _array(value, "messages")
    if not items:
        raise _fail("messages must hold at least one message", "messages")
    if len(items) > limits.max_messages:
        raise _fail(
            f"messages holds {len(items)} messages, more than the gateway's limit of {limits.max_messages}", "messages"
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"messages[{i}]"
        message = _object(item, where)
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise _fail(f"{where}.{extra[0]}: unknown field (a message has role and content)", f"{where}.{extra[0]}")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _fail(f"{where}.role must be user or assistant, got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):
            if not content:
                raise _fail(f"{where}.content must hold at least one block", f"{where}.content")
        elif not isinstance(content, str):
            raise _fail(
                f"{where}.content must be a string or an array of blocks, not {_type_name(content)}", f"{where}.content"
            )
        if role == "user":
            out.extend(_user(content, f"{where}.content"))
        else:
            out.append(_assistant(content, f"{where}.content"))
    return out


def _tools(value: Any, limits: GatewayLimits) -> list[dict[str, Any]]:
    items = _array(value, "tools")
    if len(items) > limits.max_tools:
        raise _fail(f"tools holds {len(items)} tools, more than the gateway's limit of {limits.max_tools}", "tools")
    specs: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, item in enumerate(items):
        where = f"tools[{i}]"
        tool = _object(item, where)
        kind = tool.get("type", "custom")
        if kind not in ("custom", None):
            name = tool.get("name")
            raise _fail(
                f"{where}: tool type {kind!r}{f' ({name})' if isinstance(name, str) else ''} is not supported "
                "(server and built-in tools run at Anthropic; the gateway offers custom tools only)",
                f"{where}.type",
            )
        extra = sorted(set(tool) - _TOOL_FIELDS)
        if extra:
            raise _fail(f"{where}.{extra[0]}: unknown field of a custom tool", f"{where}.{extra[0]}")
        name = _string(tool.get("name"), f"{where}.name")
        if not _TOOL_NAME.fullmatch(name):
            raise _fail(f"{where}.name must match ^[a-zA-Z0-9_-]{{1,128}}$, got {name!r}", f"{where}.name")
        if name in names:
            raise _fail(f"{where}.name {name!r} is offered twice", f"{where}.name")
        names.add(name)
        description = _string(tool.get("description", ""), f"{where}.description")
        schema = _object(tool.get("input_schema"), f"{where}.input_schema")
        if schema.get("type") != "object":
            raise _fail(f"{where}.input_schema.type must be 'object'", f"{where}.input_schema.type")
        if _depth(schema) > _MAX_SCHEMA_DEPTH:
            raise _fail(f"{where}.input_schema nests deeper than {_MAX_SCHEMA_DEPTH} levels", f"{where}.input_schema")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as error:
            raise _fail(
                f"{where}.input_schema is not a valid JSON schema: {error.message}", f"{where}.input_schema"
            ) from None
        specs.append({"type": "function", "function": {"name": name, "description": description, "parameters": schema}})
    return specs


def _tool_choice(value: Any, tool_names: set[str]) -> ToolChoice:
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    extra = sorted(set(choice) - {"type", "name", "disable_parallel_tool_use"})
    if extra:
        raise _fail(f"tool_choice.{extra[0]}: unknown field", f"tool_choice.{extra[0]}")
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise _fail(
            f"tool_choice.disable_parallel_tool_use must be a boolean, not {_type_name(parallel)}",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if kind not in ("any", "tool"):
        raise _fail(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", "tool_choice.type")
    if not tool_names:
        raise _fail(f"tool_choice {kind!r} needs tools", "tool_choice")
    if kind == "any":
        return "required"
    name = _string(choice.get("name"), "tool_choice.name", empty=False)
    if name not in tool_names:
        raise _fail(f"tool_choice.name {name!r} is not one of the tools offered", "tool_choice.name")
    return {"name": name}


def _stop(value: Any, limits: GatewayLimits) -> tuple[str, ...]:
    items = _array(value, "stop_sequences")
    if len(items) > limits.max_stop:
        raise _fail(
            f"stop_sequences holds {len(items)} strings, more than the gateway's limit of {limits.max_stop}",
            "stop_sequences",
        )
    return tuple(_string(s, f"stop_sequences[{i}]", empty=False) for i, s in enumerate(items))


def _thinking(value: Any) -> None:
    thinking = _object(value, "thinking")
    if thinking.get("type") != "disabled":
        raise _fail(
            f"thinking {thinking.get('type')!r} is not supported (the gateway serves no extended thinking); "
            "leave thinking out or set its type to disabled",
            "thinking.type",
        )


def _output_config(value: Any) -> None:
    config = _object(value, "output_config")
    for key in sorted(config):
        if key == "format" and config[key] is not None:  # ignoring it would hand the client text it cannot trust
            raise _fail(
                "output_config.format is not supported (the gateway does not constrain replies to a schema)",
                "output_config.format",
            )
        if key not in ("format", "effort"):
            raise _fail(f"output_config.{key}: unknown field", f"output_config.{key}")
    if config.get("effort") is not None:
        _string(config["effort"], "output_config.effort")  # checked, then ignored: no thinking to spend it on


def _input(call: dict[str, Any]) -> Any:
    """A call's arguments as tool_use input (the gateway's parsers give JSON objects)."""
    return json.loads(call["function"]["arguments"])


def _usage(reply: ChatReply) -> dict[str, int]:
    return {
        "input_tokens": reply.prompt_tokens - reply.cached_prompt_tokens,
        "output_tokens": reply.completion_tokens,
        "cache_read_input_tokens": reply.cached_prompt_tokens,
        "cache_creation_input_tokens": 0,
    }


def _agentloop(reply: ChatReply) -> dict[str, Any]:
    return {"token_ids": list(reply.token_ids), "chain": reply.chain, "forked": reply.forked}


def _event(payload: dict[str, Any]) -> bytes:
    return sse(json.dumps(payload, separators=(",", ":")), event=payload["type"])


class AnthropicMessages:
    """The Anthropic Messages API."""

    name = "messages"

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        if not isinstance(body, dict):
            raise _fail(f"the request body must be a JSON object, not {_type_name(body)}", None)
        unknown = sorted(set(body) - _FIELDS - set(_IGNORED))
        if unknown:
            raise _fail(f"{unknown[0]}: unknown field (Extra inputs are not permitted)", unknown[0])
        model = _string(body.get("model"), "model", empty=False)
        if "max_tokens" not in body:
            raise _fail("max_tokens is required", "max_tokens")
        max_tokens = _integer(body["max_tokens"], "max_tokens", 1)
        messages = _messages(body.get("messages"), limits)
        if body.get("system") is not None:
            system = _system(body["system"])
            if system:
                messages.insert(0, {"role": "system", "content": system})
        tools = _tools(body["tools"], limits) if body.get("tools") is not None else []
        choice: ToolChoice = "auto"
        if body.get("tool_choice") is not None:
            choice = _tool_choice(body["tool_choice"], {t["function"]["name"] for t in tools})
        temperature = top_p = None
        if body.get("temperature") is not None:
            temperature = _number(body["temperature"], "temperature", 0.0, 1.0)
        if body.get("top_p") is not None:
            top_p = _number(body["top_p"], "top_p", 0.0, 1.0, low_open=True)
        if body.get("top_k") is not None:
            _integer(body["top_k"], "top_k", 0)  # checked, then ignored (module docstring)
        stop = _stop(body["stop_sequences"], limits) if body.get("stop_sequences") is not None else ()
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _fail(f"stream must be a boolean, not {_type_name(stream)}", "stream")
        for key, kind in _IGNORED.items():
            if body.get(key) is not None and not isinstance(body[key], kind):
                raise _fail(
                    f"{key} must be {'an object' if kind is dict else 'a string'}, not {_type_name(body[key])}", key
                )
        if body.get("output_config") is not None:
            _output_config(body["output_config"])
        if body.get("thinking") is not None:
            _thinking(body["thinking"])
        return ChatRequest(
            messages=tuple(messages),
            tools=tuple(tools),
            tool_choice=choice,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            stream=stream,
            model=model,
        )

    def reply(self, reply: ChatReply) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content else []
        content += [
            {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": _input(c)}
            for c in reply.tool_calls
        ]
        return {
            "id": reply.id,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": content,
            "stop_reason": _STOP_REASONS[reply.finish_reason],
            "stop_sequence": None,
            "usage": _usage(reply),
            "agentloop": _agentloop(reply),
        }

    async def events(self, request: ChatRequest, stream: AsyncIterator[TextDelta | ChatReply]) -> AsyncIterator[bytes]:
        items = aiter(stream)
        # 1. the first item before any event: an error now is the request's HTTP error, raised to the gateway
        item = await anext(items, None)
        if item is None:  # the gateway's bug, not the client's
            raise RuntimeError("the reply stream ended without a ChatReply")
        yield _event(
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "role": "assistant",
                    "model": request.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                },
            }
        )
        # 2. text as it comes, in block 0 (opened by the first non-empty delta)
        streamed: list[str] = []
        try:
            while isinstance(item, TextDelta):
                if item.text:
                    if not streamed:
                        yield _event(
                            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
                        )
                    streamed.append(item.text)
                    yield _event(
                        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": item.text}}
                    )
                item = await anext(items, None)
        except GatewayError as error:  # the 200 and message_start are sent: the error can only be an event now
            yield _event(self.error(error))
            return
        if item is None:
            raise RuntimeError("the reply stream ended without a ChatReply")
        # 3. the final reply: the text it holds beyond what streamed, its calls, why it stopped and the usage
        sent = "".join(streamed)
        if item.content.startswith(sent) and len(item.content) > len(sent):
            if not streamed:
                yield _event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            streamed.append(item.content[len(sent) :])
            yield _event(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": streamed[-1]}}
            )
        index = 0
        if streamed:
            yield _event({"type": "content_block_stop", "index": 0})
            index = 1
        for call in item.tool_calls:
            yield _event(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": {},
                    },
                }
            )
            yield _event(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(_input(call))},
                }
            )
            yield _event({"type": "content_block_stop", "index": index})
            index += 1
        yield _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": _STOP_REASONS[item.finish_reason], "stop_sequence": None},
                "usage": _usage(item),
                "agentloop": _agentloop(item),
            }
        )
        yield _event({"type": "message_stop"})

    def error(self, error: GatewayError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ERROR_TYPES.get(error.kind, "api_error"), "message": error.message}}


ANTHROPIC_MESSAGES = AnthropicMessages()
