"""OpenAI Chat Completions (``POST .../chat/completions``) as a WireFormat.

Read tolerantly (wire_checks.py): a parameter the gateway does not know is accepted and recorded as ignored, and so
are tools of a type other than ``function`` (left out of what the model sees). A value we cannot honour (``n``
other than 1, ``logit_bias``, a ``response_format`` other than text, audio, penalties) is refused by name rather
than silently ignored, since an agent relying on one would be trained on something else. Parameters that change
nothing here (``user``, ``metadata``, ``store``, ``parallel_tool_calls``, ...) are accepted; ``reasoning_effort``
asks for the model's thinking mode (``none``: off). Images must be data URLs. The reply carries the engine's token
ids of the turn in ``agentloop.token_ids``.

Streaming: ``delta.content`` as the text decodes. A turn offered tools streams the content its parser says no call
can change (with Hermes, the text before ``<tool_call>``); the rest of the content and the calls (each in one
``tool_calls`` delta) come once the turn is parsed, since a half-written call cannot be told from text. The rules are
reply_events.py's; ``ChatStream`` writes its events as chunks.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, GatewayError, TextDelta, TokenLogprob, agentloop_extension
from .openai_errors import openai_error
from .reply_events import Failed, Finished, Logprobs, ReplyEvent, Started, ToolCall
from .wire import sse
from .wire_checks import TOP, Fields, check_tools, hosted_tool, image_part, reading

_ACCEPTED_AND_IGNORED = frozenset({
    "user", "metadata", "store", "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier",
    "reasoning_effort", "verbosity", "stream_options", "frequency_penalty", "presence_penalty", "response_format",
    "logit_bias", "n", "modalities",
})
_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "seed", "stop", "stream", "logprobs", "top_logprobs", *_ACCEPTED_AND_IGNORED,
})
_ROLES = ("system", "developer", "user", "assistant", "tool")


class OpenAIChat:
    name = "chat_completions"

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        with reading() as ignored:
            return self._parse(body, limits, ignored)

    def _parse(self, body: Any, limits: GatewayLimits, ignored: list[str]) -> ChatRequest:
        f = Fields(body, _FIELDS, TOP)
        _refuse_unsupported(f)
        messages = f.required_items("messages", max_items=limits.max_messages)
        tools = check_tools(f.items("tools", max_items=limits.max_tools) or [], "tools", _function_of)
        logprobs = f.flag("logprobs")
        top = f.integer("top_logprobs", 0, limits.max_top_logprobs) or 0
        if top and not logprobs:
            raise GatewayError("top_logprobs needs logprobs: true", param="top_logprobs")
        max_tokens = f.integer("max_completion_tokens", 1, 2**31 - 1)
        if max_tokens is None:
            max_tokens = f.integer("max_tokens", 1, 2**31 - 1)
        effort = f.text("reasoning_effort")
        return ChatRequest(
            messages=tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages)),
            tools=tools,
            tool_choice=_tool_choice(f.get("tool_choice"), tools),
            max_tokens=max_tokens,
            temperature=f.number("temperature", 0.0, 2.0),
            top_p=f.number("top_p", 0.0, 1.0, low_open=True),
            seed=f.integer("seed", 0, 2**63 - 1),
            stop=f.stop("stop", limits.max_stop),
            logprobs=logprobs,
            top_logprobs=top,
            stream=f.flag("stream"),
            model=f.text("model") or "",
            thinking=None if effort is None else effort != "none",
            ignored=tuple(ignored),
        )

    def reply(self, reply: ChatReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = [dict(c) for c in reply.tool_calls]
        else:
            message["content"] = reply.content
        return {
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [{
                "index": 0, "message": message, "finish_reason": reply.finish_reason,
                "logprobs": {"content": _logprobs(reply.logprobs), "refusal": None} if reply.logprobs else None,
            }],
            "usage": _usage(reply),
            "agentloop": agentloop_extension(reply),
        }

    def writer(self, request: ChatRequest) -> ChatStream:
        return ChatStream(request)

    def error(self, error: GatewayError) -> dict[str, Any]:
        return openai_error(error)


OPENAI_CHAT = OpenAIChat()


class ChatStream:
    """A stream's events as ``chat.completion.chunk`` objects, all with the stream's id, ending in ``[DONE]``; a failed
    stream ends with OpenAI's error object (which the openai SDK raises as an APIError) and no ``[DONE]``."""

    def __init__(self, request: ChatRequest) -> None:
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": request.model}

    def write(self, event: ReplyEvent) -> bytes:
        match event:
            case Started():
                return self._chunk({"role": "assistant", "content": ""})
            case TextDelta(text=text, logprobs=logprobs):
                return self._chunk({"content": text}, logprobs)
            case Logprobs(logprobs=logprobs):
                return self._chunk({"content": ""}, logprobs)
            case ToolCall(index=index, call=call):
                return self._chunk({"tool_calls": [{"index": index, **call}]})
            case Finished(reply=reply):
                end = {"index": 0, "delta": {}, "finish_reason": reply.finish_reason, "logprobs": None}
                return (sse(json.dumps({**self.head, "choices": [end], "agentloop": agentloop_extension(reply)}))
                        + sse(json.dumps({**self.head, "choices": [], "usage": _usage(reply)}))
                        + sse("[DONE]"))
            case Failed(error=error):
                return sse(json.dumps(openai_error(error)))
        return b""  # TextOpened, TextClosed: a chunk has no blocks to open or close

    def _chunk(self, delta: dict[str, Any], logprobs: tuple[TokenLogprob, ...] = ()) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None,
                  "logprobs": {"content": _logprobs(logprobs)} if logprobs else None}
        return sse(json.dumps({**self.head, "choices": [choice]}))


def _refuse_unsupported(f: Fields) -> None:
    if f.get("n") not in (None, 1):
        raise GatewayError("n must be 1: each sample of a group is its own session", param="n")
    if f.get("logit_bias"):
        raise GatewayError("logit_bias is not supported", param="logit_bias")
    fmt = f.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise GatewayError("response_format: only {\"type\": \"text\"} is supported", param="response_format")
    if f.get("modalities") not in (None, ["text"]):
        raise GatewayError("modalities: only [\"text\"] is supported", param="modalities")
    for name in ("frequency_penalty", "presence_penalty"):
        if f.get(name) not in (None, 0, 0.0):
            raise GatewayError(f"{name} is not supported (0 only)", param=name)


def _function_of(tool: Any, where: str) -> dict[str, Any] | None:
    t = Fields(tool, None, where)
    if t.get("type") != "function":
        hosted_tool(t.get("type"), where)
        return None
    t = Fields(tool, {"type", "function"}, where)
    fn = Fields(t.get("function"), {"name", "description", "parameters", "strict"}, f"{where}.function")
    return {"name": fn.required_text("name"), "description": fn.text("description") or "",
            "parameters": fn.get("parameters", {"type": "object", "properties": {}})}


def _tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> Any:
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if isinstance(name, str) and any(t["function"]["name"] == name for t in tools):
            return {"name": name}
        raise GatewayError(f"tool_choice names the function {name!r}, which is not among the tools",
                           param="tool_choice")
    raise GatewayError("tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}", param="tool_choice")


def _message(value: Any, where: str) -> dict[str, Any]:
    m = Fields(value, {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "function_call"}, where)
    role = m.required_text("role")
    if role not in _ROLES:
        raise GatewayError(f"{where}.role must be one of {', '.join(_ROLES)}", param=f"{where}.role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _content(m.get("content"), f"{where}.content", images=role == "user")}
    if role == "assistant":
        calls = m.items("tool_calls") or []
        if calls:
            out["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if out["content"] is None:
            out["content"] = ""
    elif out["content"] is None:
        raise GatewayError(f"{where}.content is required", param=f"{where}.content")
    if role == "tool":
        out["tool_call_id"] = m.required_text("tool_call_id")
    return out


def _content(value: Any, where: str, images: bool) -> str | list[dict[str, Any]] | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise GatewayError(f"{where} must be a string or a list of parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        p = Fields(part, {"type", "text", "image_url"}, f"{where}[{j}]")
        kind = p.required_text("type")
        if kind == "text":
            parts.append({"type": "text", "text": p.required_text("text")})
        elif kind == "image_url" and images:
            url = Fields(p.get("image_url"), {"url", "detail"}, f"{where}[{j}].image_url")
            parts.append(image_part(url.required_text("url"), f"{where}[{j}].image_url.url"))
        else:
            allowed = "text or image_url" if images else "text"
            raise GatewayError(f"{where}[{j}].type {kind!r} is not supported here ({allowed})",
                               param=f"{where}[{j}].type")
    return parts


def _call(value: Any, where: str) -> dict[str, Any]:
    # index: a call the openai SDK assembled from a stream keeps its delta's position, and agents echo it (ignored)
    c = Fields(value, {"id", "type", "function", "index"}, where)
    fn = Fields(c.get("function"), {"name", "arguments"}, f"{where}.function")
    return {"id": c.text("id") or "", "type": "function",
            "function": {"name": fn.required_text("name"), "arguments": fn.text("arguments") or ""}}


def _logprobs(items: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
             "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.top]}
            for t in items]


def _usage(reply: ChatReply) -> dict[str, Any]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_prompt_tokens}}
