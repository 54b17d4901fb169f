"""Anthropic's Messages API (``POST /v1/messages``) as a WireFormat: its request read into the gateway's ChatRequest,
a ChatReply written as its ``Message``, a stream as its server-sent events, an error in its error shape.

Reading a request. Read tolerantly (wire_checks.py): Anthropic's API grows fields every month and Claude Code sends
new ones each release, so a top-level field, message key or tool key the gateway does not know is accepted and
recorded as ignored. A hostile client may send any JSON value, so every field is type-checked before it is used,
and every error is a GatewayError with ``param`` set to the field's path (``messages[3].content[0].source``); the
rules every format shares (numbers, tool names and schemas, images) are wire_checks.py's, the blocks are read in
anthropic_input.py. Anthropic blocks map onto the internal (OpenAI-chat-shaped) messages of ``exchange.py``:

- ``system`` (a string or text blocks) becomes one leading system message, its blocks joined by a blank line (chat
  templates want a system message's content as a string); a ``system`` message among ``messages`` (Claude Code
  sends one after the first user message) is a system message where it stands;
- a user message's ``tool_result`` blocks become ``tool`` messages, in order and before the rest of that user
  message (text and images), which follows them as a user message; ``is_error`` prefixes the result with "Error: ",
  as the model must read it as a failure without a field of its own;
- an assistant message's text blocks become its content (joined) and its ``tool_use`` blocks its ``tool_calls``;
  its ``thinking`` and ``redacted_thinking`` blocks are left out (recorded): the gateway never wrote one, so they
  are no part of the session's token record;
- an image must be base64 (the gateway has no network, so ``url`` and ``file`` sources are refused) and becomes a
  data URL;
- tools become OpenAI function specs; server tools (a ``type`` other than ``custom``) and tools marked
  ``defer_loading`` (which Anthropic keeps out of the model's context until a tool search loads them) are left out
  of what the model sees and recorded;
- ``top_k`` is checked and ignored (ChatRequest has no top_k: the gateway's sampling is the run's, not the
  agent's); so are ``disable_parallel_tool_use``, ``cache_control`` markers, ``output_config.effort`` and the
  fields of ``_IGNORED`` (metadata, service tier, region...), none of which changes what the model writes;
  ``thinking`` (enabled or adaptive) asks for the model's thinking mode, which the gateway turns on where the chat
  template has one and otherwise records as ignored; ``output_config.format`` is refused (the gateway does not
  constrain a reply to a schema: ignoring it would hand the client text it cannot trust), and so is
  ``container`` (no server tools).

Writing a reply. ``usage.input_tokens`` counts the prompt tokens not read from the prefix cache, as Anthropic's
does (its total is input + cache read + cache creation). The engine's token ids ride in a top-level ``agentloop``
object (in ``message_delta`` when streamed), which Anthropic's clients keep as an unknown field. A finish on a stop
string is reported as ``end_turn``: ChatReply does not say which stop string matched.

Streaming (the rules are reply_events.py's; ``MessagesStream`` writes its events). Nothing is written before the
turn starts, so an error the gateway raises before then is an HTTP error, not an event. The text is one block as it
comes; a block per tool call follows, its input sent whole as one ``input_json_delta``; a failure after the start is
``event: error``. The message id is made here (``msg_...``), as the stream's id is needed before the ChatReply
carrying the gateway's id arrives.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .anthropic_input import read_messages, read_tool_choice, read_tools, system_text
from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, FinishReason, GatewayError, TextDelta, ToolChoice, agentloop_extension
from .reply_events import Failed, Finished, ReplyEvent, Started, TextClosed, TextOpened, ToolCall
from .wire import sse
from .wire_checks import TOP, Fields, reading, refuse

#: The top-level fields of a Messages request this format reads.
_FIELDS = frozenset(
    "model max_tokens system messages tools tool_choice temperature top_p top_k stop_sequences stream thinking "
    "output_config container".split()
)
#: Fields accepted and ignored, objects and strings (their type is checked): where and how Anthropic would serve the
#: request (tier, region, speed, workspace), its prompt-cache hints and request labels; none changes what the model
#: writes.
_IGNORED_OBJECTS = ("metadata", "cache_control", "diagnostics")
_IGNORED_STRINGS = ("service_tier", "speed", "inference_geo", "user_profile_id", "workspace_id")
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
    "unauthenticated": "authentication_error",
    "conflict": "invalid_request_error",
}


def _thinking(value: Any) -> bool | None:
    """Whether the request asks for the model's thinking mode (``enabled``, ``adaptive``) or not (``disabled``)."""
    if value is None:
        return None
    thinking = Fields(value, None, "thinking")
    return thinking.required_text("type") != "disabled"


def _output_config(value: Any) -> None:
    config = Fields(value, ("format", "effort"), "output_config")
    if config.get("format") is not None:  # ignoring it would hand the client text it cannot trust
        raise refuse("output_config.format is not supported (the gateway does not constrain replies to a schema)",
                     "output_config.format")
    config.text("effort")  # checked, then ignored: no thinking to spend it on


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


def _event(payload: dict[str, Any]) -> bytes:
    return sse(json.dumps(payload, separators=(",", ":")), event=payload["type"])


class AnthropicMessages:
    """The Anthropic Messages API."""

    name = "messages"

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        with reading() as ignored:
            return self._parse(body, limits, ignored)

    def _parse(self, body: Any, limits: GatewayLimits, ignored: list[str]) -> ChatRequest:
        f = Fields(body, _FIELDS | {*_IGNORED_OBJECTS, *_IGNORED_STRINGS}, TOP)
        messages = read_messages(f.required_items("messages", limits.max_messages, "max_messages"))
        system = system_text(f.get("system", ""))
        if system:
            messages.insert(0, {"role": "system", "content": system})
        tools = read_tools(f.items("tools") or [], limits)
        choice: ToolChoice = "auto"
        if f.get("tool_choice") is not None:
            choice = read_tool_choice(f.get("tool_choice"), tools)
        f.integer("top_k", 0, _MAX_INT)  # checked, then ignored (module docstring)
        for key in _IGNORED_OBJECTS:
            f.mapping(key)
        for key in _IGNORED_STRINGS:
            f.text(key)
        if f.get("output_config") is not None:
            _output_config(f.get("output_config"))
        if f.get("container") is not None:
            raise refuse("container is not supported (it runs server tools at Anthropic; the gateway offers custom "
                         "tools only)", "container")
        return ChatRequest(
            messages=tuple(messages),
            tools=tools,
            tool_choice=choice,
            max_tokens=f.required_integer("max_tokens", 1, _MAX_INT),
            temperature=f.number("temperature", 0.0, 1.0),
            top_p=f.number("top_p", 0.0, 1.0, low_open=True),
            stop=f.strings("stop_sequences", limits.max_stop, "max_stop"),
            stream=f.flag("stream"),
            model=f.required_text("model", nonempty=True),
            thinking=_thinking(f.get("thinking")),
            ignored=tuple(ignored),
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
            "agentloop": agentloop_extension(reply),
        }

    def writer(self, request: ChatRequest) -> MessagesStream:
        return MessagesStream(request)

    def error(self, error: GatewayError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ERROR_TYPES.get(error.kind, "api_error"), "message": error.message}}


ANTHROPIC_MESSAGES = AnthropicMessages()


class MessagesStream:
    """A stream's events as Anthropic's: ``message_start``, the text block (index 0) and a ``tool_use`` block per call
    (its input whole in one ``input_json_delta``), ``message_delta`` and ``message_stop``. A failed stream ends with
    ``event: error`` (which the anthropic SDK raises as an APIStatusError)."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request

    def write(self, event: ReplyEvent) -> bytes:
        match event:
            case Started():
                return _event({"type": "message_start", "message": {
                    "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                    "model": self.request.model, "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}})
            case TextOpened():
                block = {"type": "text", "text": ""}
                return _event({"type": "content_block_start", "index": 0, "content_block": block})
            case TextDelta(text=text) if text:
                delta = {"type": "text_delta", "text": text}
                return _event({"type": "content_block_delta", "index": 0, "delta": delta})
            case TextClosed():
                return _event({"type": "content_block_stop", "index": 0})
            case ToolCall(block=block, call=call):
                start = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
                arguments = {"type": "input_json_delta", "partial_json": json.dumps(_input(call))}
                return (_event({"type": "content_block_start", "index": block, "content_block": start})
                        + _event({"type": "content_block_delta", "index": block, "delta": arguments})
                        + _event({"type": "content_block_stop", "index": block}))
            case Finished(reply=reply):
                return _event({"type": "message_delta",
                               "delta": {"stop_reason": _STOP_REASONS[reply.finish_reason], "stop_sequence": None},
                               "usage": _usage(reply), "agentloop": agentloop_extension(reply)}) + _event(
                    {"type": "message_stop"})
            case Failed(error=error):
                return _event(ANTHROPIC_MESSAGES.error(error))
        return b""  # an empty delta, logprobs: the API has no place for them
