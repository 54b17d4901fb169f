"""The OpenAI Responses API (``POST /v1/responses``) as a gateway wire format.

The gateway keeps no Responses state of its own: a client sends the whole conversation in ``input`` every time (the
session keeps the token context separately, and forks a chain when the history is not an append), so
``previous_response_id``, ``conversation`` and ``item_reference`` items are refused, and ``store`` (true or false)
is accepted and nothing is stored: a later request cannot refer to this response.

Input items map onto the internal OpenAI-chat-shaped messages (exchange.py): ``instructions`` is a leading system
message, developer messages are system messages, ``function_call`` items become the ``tool_calls`` of one assistant
message (joined to the assistant message just before them, or to a new one with content ""),
``function_call_output`` items become tool messages, and ``reasoning`` items are dropped (the engine's own text is
what the session recorded; a reasoning item carries only summaries or encrypted content). Fields echoed from a
response that mean nothing as input (an item's ``id`` and ``status``, a text part's ``annotations`` and
``logprobs``) are ignored.

Accepted and ignored: ``store``, ``metadata``, ``user``, ``parallel_tool_calls`` (the model's calls are what it
wrote: cutting them would break the token-exact record), ``include`` (but ``message.output_text.logprobs`` asks for
logprobs), ``strict`` of a function tool (no constrained decoding), ``prompt_cache_key``, ``safety_identifier``,
``service_tier``, ``stream_options``, ``text.verbosity`` and ``reasoning.summary``. ``reasoning.effort`` asks for
the model's thinking mode (``none``: off; how much it thinks the gateway cannot set). Read tolerantly
(wire_checks.py): a field the gateway does not know (Codex's ``client_metadata``...) is accepted and recorded as
ignored, and so is a hosted tool (``web_search``, a ``namespace`` of another client's tools, computer use, file
search...), left out of what the model sees. Refused by name: ``truncation: auto`` (a trajectory keeps every
token), structured-output text formats and ``background``.

Reading: the top-level fields here, the input items and tools in responses_input.py, the rules every format
shares (numbers, tool names and schemas, images) in wire_checks.py; writing: the Response object and its items in
responses_output.py, its stream events here.

The non-streamed reply cannot echo the request's tools, tool_choice or sampling (``reply`` sees only the ChatReply):
it reports the API's defaults; the streamed response echoes them. A stream's response id is made when it starts,
before the ChatReply (and its id) exists, so a streamed response has its own id.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Any

from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, GatewayError, TextDelta, TokenLogprob
from .openai_errors import openai_error
from .reply_events import Failed, Finished, ReplyEvent, Started, TextClosed, TextOpened, ToolCall
from .responses_input import STATELESS, read_input, read_tool_choice, read_tools
from .responses_output import function_call_item, output_items, output_logprob, response_object
from .wire import sse
from .wire_checks import TOP, Fields, reading, refuse

# Fields the gateway serves; anything else is refused by name.
_FIELDS = frozenset(
    "model instructions input tools tool_choice max_output_tokens temperature top_p stream parallel_tool_calls "
    "metadata user store truncation top_logprobs include text reasoning previous_response_id conversation "
    "background prompt_cache_key safety_identifier service_tier stream_options".split()
)
_MAX_TOKENS = 2**31 - 1
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: The API knows about ten ``include`` values; more is no client's request.
_MAX_INCLUDE = 64
#: GatewayError.kind -> a failed Response's ``error.code`` (the API's codes: the request's fault or the server's).
_FAILED_CODES = {"rate_limit": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}


class OpenAIResponses:
    """``POST /v1/responses`` read into a ChatRequest; a ChatReply written as a ``Response`` or its stream events."""

    name = "responses"

    # --- the request ---

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        with reading() as ignored:
            return self._parse(body, limits, ignored)

    def _parse(self, body: Any, limits: GatewayLimits, ignored: list[str]) -> ChatRequest:
        f = Fields(body, _FIELDS, TOP)
        for key in ("previous_response_id", "conversation"):
            if f.get(key) is not None:
                raise refuse(f"{key} is not supported: {STATELESS}", key)
        if f.get("background") is not None and f.get("background") is not False:
            raise refuse("background must be false: the gateway answers in the request", "background")
        for key in ("user", "prompt_cache_key", "safety_identifier", "service_tier"):
            f.text(key)
        for key in ("store", "parallel_tool_calls"):
            f.flag(key)
        f.mapping("stream_options")
        _check_metadata(f)
        if f.get("truncation") not in (None, "disabled"):
            raise refuse("truncation must be 'disabled': the gateway never drops context (a trajectory keeps every "
                         "token)", "truncation")
        _check_text(f.mapping("text"))
        thinking = _reasoning(f.mapping("reasoning"))
        tools = read_tools(f.items("tools"), limits)
        top_logprobs = f.integer("top_logprobs", 0, limits.max_top_logprobs, bound="max_top_logprobs")
        include = f.strings("include", max_items=_MAX_INCLUDE)
        return ChatRequest(
            messages=tuple(read_input(f.get("input"), f.text("instructions"), limits)),
            tools=tools,
            tool_choice=read_tool_choice(f.get("tool_choice"), tools),
            max_tokens=f.integer("max_output_tokens", 1, _MAX_TOKENS),
            temperature=f.number("temperature", 0, 2),
            top_p=f.number("top_p", 0, 1, low_open=True),
            logprobs=top_logprobs is not None or _LOGPROBS_INCLUDE in include,
            top_logprobs=top_logprobs or 0,
            stream=f.flag("stream"),
            model=f.text("model") or "",
            thinking=thinking,
            ignored=tuple(ignored),
        )

    # --- the reply ---

    def reply(self, reply: ChatReply) -> dict[str, Any]:
        # The reply's id may carry another format's prefix (chatcmpl-...): a Responses id is resp_<the rest>.
        rid = f"resp_{reply.id.rsplit('-', 1)[-1].removeprefix('resp_')}"
        created = reply.created or int(time.time())
        return response_object(rid, created, reply.model, None, output_items(rid, reply), reply)

    def writer(self, request: ChatRequest) -> ResponsesStream:
        return ResponsesStream(request)

    def error(self, error: GatewayError) -> dict[str, Any]:
        return openai_error(error)


class ResponsesStream:
    """A stream's events as the Responses API's: ``response.created`` and ``response.in_progress``, the message item
    and its text part, each function call item, then ``response.completed`` (``response.incomplete`` when cut by
    length). A failed stream ends with an ``error`` event and then ``response.failed`` (the response, status
    ``failed``, its ``error`` set): the one names the failure, the other ends the response for a client waiting
    for its last lifecycle event."""

    def __init__(self, request: ChatRequest) -> None:
        self.request = request
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{self.rid.removeprefix('resp_')}"
        self.created_at = int(time.time())
        self._sequence = itertools.count()

    def write(self, event: ReplyEvent) -> bytes:
        match event:
            case Started():
                started = response_object(self.rid, self.created_at, self.request.model, self.request, [], None)
                return self._event("response.created", response=started) + self._event(
                    "response.in_progress", response=started)
            case TextOpened():
                item = {"id": self.message_id, "type": "message", "role": "assistant", "status": "in_progress",
                        "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                return self._event("response.output_item.added", output_index=0, item=item) + self._event(
                    "response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                    part=part)
            case TextDelta(text=text, logprobs=logprobs):
                return self._event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                   content_index=0, delta=text, logprobs=_stream_logprobs(logprobs))
            case TextClosed(reply=reply):
                message = output_items(self.rid, reply, message=True)[0]
                return (
                    self._event("response.output_text.done", item_id=self.message_id, output_index=0,
                                content_index=0, text=reply.content, logprobs=_stream_logprobs(reply.logprobs))
                    + self._event("response.content_part.done", item_id=self.message_id, output_index=0,
                                  content_index=0, part=message["content"][0])
                    + self._event("response.output_item.done", output_index=0, item=message)
                )
            case ToolCall(index=index, block=block, call=call):
                item = function_call_item(self.rid, index, call)
                return (
                    self._event("response.output_item.added", output_index=block,
                                item={**item, "arguments": "", "status": "in_progress"})
                    + self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=block,
                                  delta=item["arguments"])
                    + self._event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=block, arguments=item["arguments"])
                    + self._event("response.output_item.done", output_index=block, item=item)
                )
            case Finished(reply=reply, text_block=text_block):
                # the whole response, as the non-streamed reply (with this stream's id and the request echoed)
                done = response_object(self.rid, self.created_at, reply.model, self.request,
                                       output_items(self.rid, reply, message=text_block), reply)
                return self._event(f"response.{done['status']}", response=done)
            case Failed(error=error):
                failed = {**response_object(self.rid, self.created_at, self.request.model, self.request, [], None),
                          "status": "failed", "error": {"code": _FAILED_CODES.get(error.kind, "server_error"),
                                                        "message": error.message}}
                return self._event("error", code=error.kind, message=error.message, param=error.param) + self._event(
                    "response.failed", response=failed)
        return b""  # Logprobs outside a text: output_text.done tells every token's

    def _event(self, kind: str, **fields: Any) -> bytes:
        return sse(json.dumps({"type": kind, **fields, "sequence_number": next(self._sequence)}), event=kind)


def _stream_logprobs(logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [output_logprob(lp, with_bytes=False) for lp in logprobs]


# --- the fields checked and ignored ---


def _check_metadata(f: Fields) -> None:
    """The API's bounds: 16 pairs, keys of 64 characters, values of 512."""
    value = f.get("metadata")
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > 16:
        raise refuse("metadata must be an object of at most 16 string pairs", "metadata")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise refuse(f"metadata[{key[:64]!r}] must be a string of at most 512 characters under a key of at "
                         "most 64", "metadata")


def _check_text(value: dict[str, Any] | None) -> None:
    if value is None:
        return
    text = Fields(value, ("format", "verbosity"), "text")
    fmt = text.get("format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind != "text":
            raise refuse(f"text.format.type {kind!r:.80} is not supported: only plain text (no structured outputs)",
                         "text.format.type")
    text.one_of("verbosity", ("low", "medium", "high"))


def _reasoning(value: dict[str, Any] | None) -> bool | None:
    """Whether the request asks for the model's thinking mode (None: it does not say)."""
    if value is None:
        return None
    reasoning = Fields(value, ("effort", "summary", "generate_summary"), "reasoning")
    effort = reasoning.text("effort")
    return None if effort is None else effort != "none"


OPENAI_RESPONSES = OpenAIResponses()
