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
``service_tier``, ``stream_options`` and ``text.verbosity``. Refused by name: ``reasoning.effort`` other than none
(the gateway cannot set how much the model thinks), ``truncation: auto`` (a trajectory keeps every token),
structured-output text formats, built-in tools, ``background`` and every field the API does not have (as the
OpenAI API does).

The non-streamed reply cannot echo the request's tools, tool_choice or sampling (``reply`` sees only the ChatReply):
it reports the API's defaults; the streamed response echoes them. A stream's response id is made when it starts,
before the ChatReply (and its id) exists, so a streamed response has its own id.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import jsonschema
from jsonschema.validators import Draft202012Validator, validator_for

from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, GatewayError, TextDelta, TokenLogprob, ToolChoice
from .wire import sse

# Fields the gateway serves; anything else is refused by name.
_FIELDS = frozenset(
    "model instructions input tools tool_choice max_output_tokens temperature top_p stream parallel_tool_calls "
    "metadata user store truncation top_logprobs include text reasoning previous_response_id conversation "
    "background prompt_cache_key safety_identifier service_tier stream_options".split()
)
_STATELESS = "send the whole input; store is not supported"
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
# OpenAI's rule for function names: a chat template writes the name into the prompt verbatim.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,", re.ASCII)
_MAX_TOKENS = 2**31 - 1
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
# A logprob JSON can carry (-inf is not JSON); far below any sampled token's.
_LOGPROB_FLOOR = -9999.0
# GatewayError.status -> OpenAI's error type (as the Chat Completions format maps it); the code is the error's kind.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def _refuse(message: str, param: str | None) -> NoReturn:
    raise GatewayError(message, status=400, kind="invalid_request", param=param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # A JSON integer may be too large for a float (math.isfinite would raise); a float may be nan or inf.
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _optional(body: dict[str, Any], key: str, check: Callable[[Any], bool], what: str) -> Any:
    """``body[key]`` (None when absent or null), refused unless ``check`` holds."""
    value = body.get(key)
    if value is not None and not check(value):
        _refuse(f"{key} must be {what}, got {value!r:.80}", key)
    return value


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        _refuse(f"{param} must be a string, got {type(value).__name__}", param)
    return value


def _nonempty(value: Any, param: str) -> str:
    if not _text(value, param):
        _refuse(f"{param} must not be empty", param)
    return value


class OpenAIResponses:
    """``POST /v1/responses`` read into a ChatRequest; a ChatReply written as a ``Response`` or its stream events."""

    name = "responses"

    # --- the request ---

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        if not isinstance(body, dict):
            _refuse(f"the request body must be a JSON object, got {type(body).__name__}", None)
        for key in body:
            if key not in _FIELDS:
                _refuse(f"Unknown parameter: {key!r:.80}", str(key)[:80])
        for key in ("previous_response_id", "conversation"):
            if body.get(key) is not None:
                _refuse(f"{key} is not supported: {_STATELESS}", key)
        if body.get("background") is not None and body["background"] is not False:
            _refuse("background must be false: the gateway answers in the request", "background")
        for key in ("user", "prompt_cache_key", "safety_identifier", "service_tier"):
            _optional(body, key, lambda v: isinstance(v, str), "a string")
        for key in ("store", "stream", "parallel_tool_calls"):
            _optional(body, key, lambda v: isinstance(v, bool), "a boolean")
        _optional(body, "stream_options", lambda v: isinstance(v, dict), "an object")
        _check_metadata(body.get("metadata"))
        if body.get("truncation") not in (None, "disabled"):
            _refuse(
                "truncation must be 'disabled': the gateway never drops context (a trajectory keeps every token)",
                "truncation",
            )
        _check_text(body.get("text"))
        _check_reasoning(body.get("reasoning"))

        model = _optional(body, "model", lambda v: isinstance(v, str), "a string") or ""
        instructions = _optional(body, "instructions", lambda v: isinstance(v, str), "a string")
        messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        messages += _input(body.get("input"))
        if len(messages) > limits.max_messages:
            _refuse(
                f"input holds {len(messages)} messages (instructions included), more than the gateway's "
                f"max_messages {limits.max_messages}",
                "input",
            )
        tools = _tools(body.get("tools"), limits)
        tool_choice = _tool_choice(body.get("tool_choice"), tools)

        max_tokens = _optional(
            body,
            "max_output_tokens",
            lambda v: _is_int(v) and 1 <= v <= _MAX_TOKENS,
            f"an integer in [1, {_MAX_TOKENS}]",
        )
        temperature = _optional(body, "temperature", lambda v: _is_number(v) and 0 <= v <= 2, "a number in [0, 2]")
        top_p = _optional(body, "top_p", lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]")
        top_logprobs = _optional(
            body,
            "top_logprobs",
            lambda v: _is_int(v) and 0 <= v <= limits.max_top_logprobs,
            f"an integer in [0, {limits.max_top_logprobs}] (the gateway's max_top_logprobs)",
        )
        include = (
            _optional(
                body,
                "include",
                lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
                "a list of strings",
            )
            or []
        )
        return ChatRequest(
            messages=tuple(messages),
            tools=tuple(tools),
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=None if temperature is None else float(temperature),
            top_p=None if top_p is None else float(top_p),
            logprobs=top_logprobs is not None or _LOGPROBS_INCLUDE in include,
            top_logprobs=top_logprobs or 0,
            stream=bool(body.get("stream")),
            model=model,
        )

    # --- the reply ---

    def reply(self, reply: ChatReply) -> dict[str, Any]:
        # The reply's id may carry another format's prefix (chatcmpl-...): a Responses id is resp_<the rest>.
        rid = f"resp_{reply.id.rsplit('-', 1)[-1].removeprefix('resp_')}"
        return _response(rid, reply.created or int(time.time()), reply.model, None, _output(rid, reply), reply)

    async def events(self, request: ChatRequest, stream: AsyncIterator[TextDelta | ChatReply]) -> AsyncIterator[bytes]:
        # 1. The first item before the first event: a GatewayError there is still the app's HTTP error.
        items = aiter(stream)
        first = await anext(items, None)
        rid = f"resp_{uuid.uuid4().hex}"
        created_at = int(time.time())
        sequence = itertools.count()

        def event(kind: str, **fields: Any) -> bytes:
            return sse(json.dumps({"type": kind, **fields, "sequence_number": next(sequence)}), event=kind)

        started = _response(rid, created_at, request.model, request, [], None)
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)

        # 2. Text as it streams: the message item opens with the first delta.
        message_id = f"msg_{rid.removeprefix('resp_')}"
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        opened = False

        def open_message() -> list[bytes]:
            item = {"id": message_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            return [
                event("response.output_item.added", output_index=0, item=item),
                event("response.content_part.added", item_id=message_id, output_index=0, content_index=0, part=part),
            ]

        def delta(text: str, logprobs: tuple[TokenLogprob, ...]) -> bytes:
            return event(
                "response.output_text.delta",
                item_id=message_id,
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[_delta_logprob(lp) for lp in logprobs],
            )

        final: ChatReply | None = None
        try:
            item: TextDelta | ChatReply | None = first
            while item is not None:
                if isinstance(item, ChatReply):
                    final = item
                    break
                if item.text and not opened:
                    for frame in open_message():
                        yield frame
                    opened = True
                if opened:
                    yield delta(item.text, item.logprobs)
                item = await anext(items, None)
        except GatewayError as error:
            yield event("error", code=error.kind, message=error.message, param=error.param)
            return
        if final is None:
            yield event("error", code="infrastructure", message="the engine's stream ended without a reply", param=None)
            return

        # 3. The text's closing events, then each tool call whole (a turn offered tools parses its calls at the end).
        # An opened message is closed even if the reply's content came out empty (the client would wait for it).
        output = _output(rid, final, message=opened)
        index = 0
        if output and output[0]["type"] == "message":
            if not opened:
                for frame in open_message():
                    yield frame
                yield delta(final.content, final.logprobs)
            message = output[0]
            text_part = message["content"][0]
            yield event(
                "response.output_text.done",
                item_id=message_id,
                output_index=0,
                content_index=0,
                text=final.content,
                logprobs=[_delta_logprob(lp) for lp in final.logprobs],
            )
            yield event(
                "response.content_part.done", item_id=message_id, output_index=0, content_index=0, part=text_part
            )
            yield event("response.output_item.done", output_index=0, item=message)
            index = 1
        for call in output[index:]:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**call, "arguments": "", "status": "in_progress"},
            )
            yield event(
                "response.function_call_arguments.delta",
                item_id=call["id"],
                output_index=index,
                delta=call["arguments"],
            )
            yield event(
                "response.function_call_arguments.done",
                item_id=call["id"],
                output_index=index,
                arguments=call["arguments"],
            )
            yield event("response.output_item.done", output_index=index, item=call)
            index += 1

        # 4. The whole response, as the non-streamed reply would be (but with this stream's id and the request echoed).
        done = _response(rid, created_at, final.model, request, output, final)
        yield event(f"response.{done['status']}", response=done)

    def error(self, error: GatewayError) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(error.status, "server_error")
        return {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.kind}}


# --- reading the input ---


def _input(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value:
            _refuse("input must not be empty", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        _refuse(f"input must be a string or a list of items, got {type(value).__name__}", "input")
    if not value:
        _refuse("input must not be empty", "input")
    messages: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    # The assistant message that function_call items join: the last message while it is an assistant one.
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            _refuse(f"{param} must be an object, got {type(item).__name__}", param)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            call_id = _nonempty(item.get("call_id"), f"{param}.call_id")
            if call_id in call_ids:
                _refuse(f"{param}.call_id {call_id!r:.80} is used by an earlier function_call", f"{param}.call_id")
            call_ids.add(call_id)
            name = _nonempty(item.get("name"), f"{param}.name")
            arguments = _text(item.get("arguments"), f"{param}.arguments")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["tool_calls"] = [*messages[-1].get("tool_calls", ()), call]
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _nonempty(item.get("call_id"), f"{param}.call_id")
            if call_id not in call_ids:
                _refuse(
                    f"{param}.call_id {call_id!r:.80} answers no earlier function_call in input ({_STATELESS})",
                    f"{param}.call_id",
                )
            output = item.get("output")
            content = output if isinstance(output, str) else _collapse(_parts(output, "tool", f"{param}.output"))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            _refuse(f"{param}: item_reference is not supported: {_STATELESS}", f"{param}.type")
        elif isinstance(kind, str):
            _refuse(
                f"{param}.type {kind!r:.80} is not supported (messages, function_call, function_call_output "
                f"and reasoning items are)",
                f"{param}.type",
            )
        else:
            _refuse(f"{param} must have a type or a role", f"{param}.type")
    return messages


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        _refuse(f"{param}.role must be one of {sorted(_ROLES)}, got {role!r:.80}", f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    parts = _parts(content, role, f"{param}.content")
    if role == "assistant":
        # The model's text is one string (a reply is one output_text part): the template renders it as one.
        return {"role": "assistant", "content": "".join(p["text"] for p in parts)}
    return {"role": _ROLES[role], "content": _collapse(parts)}


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part alone as its string: every chat template renders a string content; not every one a list."""
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _parts(value: Any, role: str, param: str) -> list[dict[str, Any]]:
    """A content list as internal parts."""
    if not isinstance(value, list):
        _refuse(f"{param} must be a string or a list of content parts, got {type(value).__name__}", param)
    if not value:
        _refuse(f"{param} must not be empty", param)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            _refuse(f"{where} must be an object, got {type(part).__name__}", where)
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": _text(part.get("text"), f"{where}.text")})
        elif kind == "input_image" and role != "assistant":
            parts.append({"type": "image", "image": _image(part, where)})
        else:
            _refuse(
                f"{where}.type {kind!r:.80} is not supported in a {role} message (input_text, output_text and "
                f"input_image, the last not from the assistant, are)",
                f"{where}.type",
            )
    return parts


def _image(part: dict[str, Any], where: str) -> str:
    if part.get("file_id") is not None:
        _refuse(f"{where}.file_id is not supported: send the image as a data URL in image_url", f"{where}.file_id")
    url = part.get("image_url")
    if not isinstance(url, str):
        _refuse(f"{where}.image_url must be a data URL string", f"{where}.image_url")
    if not _DATA_URL.match(url):
        _refuse(
            f"{where}.image_url must be a data URL (data:image/<type>;base64,...): the gateway has no network "
            f"to fetch {url[:40]!r}",
            f"{where}.image_url",
        )
    return url


# --- the other request fields ---


def _tools(value: Any, limits: GatewayLimits) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        _refuse(f"tools must be a list, got {type(value).__name__}", "tools")
    if len(value) > limits.max_tools:
        _refuse(f"tools holds {len(value)} tools, more than the gateway's max_tools {limits.max_tools}", "tools")
    specs: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            _refuse(f"{param} must be an object, got {type(tool).__name__}", param)
        if tool.get("type") != "function":
            _refuse(
                f"{param}.type {tool.get('type')!r:.80} is not supported: the gateway serves function tools only",
                f"{param}.type",
            )
        name = _text(tool.get("name"), f"{param}.name")
        if not _TOOL_NAME.fullmatch(name):
            _refuse(f"{param}.name must be 1 to 64 letters, digits, _ or -, got {name!r:.80}", f"{param}.name")
        if name in names:
            _refuse(f"{param}.name {name!r} is offered twice", f"{param}.name")
        names.add(name)
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            _refuse(f"{param}.strict must be a boolean", f"{param}.strict")
        function: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            function["description"] = _text(tool["description"], f"{param}.description")
        if tool.get("parameters") is not None:
            function["parameters"] = _schema(tool["parameters"], f"{param}.parameters")
        specs.append({"type": "function", "function": function})
    return specs


def _schema(schema: Any, param: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        _refuse(f"{param} must be a JSON Schema object, got {type(schema).__name__}", param)
    if not isinstance(schema.get("$schema", ""), str):
        _refuse(f"{param}.$schema must be a string", f"{param}.$schema")
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as error:
        _refuse(f"{param} is not a valid JSON Schema: {error.message:.200}", param)
    except RecursionError:
        _refuse(f"{param} is nested too deeply to check", param)
    return schema


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> ToolChoice:
    names = {tool["function"]["name"] for tool in tools}
    if value is None or value in ("auto", "none"):
        return value or "auto"
    if value == "required":
        if not tools:
            _refuse("tool_choice 'required' needs tools", "tool_choice")
        return "required"
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or name not in names:
            _refuse(f"tool_choice.name {name!r:.80} is not among the function tools offered", "tool_choice.name")
        return {"name": name}
    if isinstance(value, dict):
        _refuse(
            f"tool_choice.type {value.get('type')!r:.80} is not supported (auto, none, required or a function)",
            "tool_choice.type",
        )
    _refuse(
        f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}, got {value!r:.80}",
        "tool_choice",
    )


def _check_metadata(value: Any) -> None:
    # The API's bounds: 16 pairs, keys of 64 characters, values of 512.
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > 16:
        _refuse("metadata must be an object of at most 16 string pairs", "metadata")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            _refuse(
                f"metadata[{key[:64]!r}] must be a string of at most 512 characters under a key of at most 64",
                "metadata",
            )


def _check_text(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        _refuse(f"text must be an object, got {type(value).__name__}", "text")
    for key in value:
        if key not in ("format", "verbosity"):
            _refuse(f"Unknown parameter: text.{key:.80}", f"text.{key:.80}")
    fmt = value.get("format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind != "text":
            _refuse(
                f"text.format.type {kind!r:.80} is not supported: only plain text (no structured outputs)",
                "text.format.type",
            )
    if value.get("verbosity") not in (None, "low", "medium", "high"):
        _refuse("text.verbosity must be low, medium or high", "text.verbosity")


def _check_reasoning(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        _refuse(f"reasoning must be an object, got {type(value).__name__}", "reasoning")
    if value.get("effort") not in (None, "none"):
        _refuse(
            f"reasoning.effort {value.get('effort')!r:.80} is not supported: the gateway cannot set how much the "
            f"model reasons (none or null)",
            "reasoning.effort",
        )


# --- writing the reply ---


def _output(rid: str, reply: ChatReply, *, message: bool = False) -> list[dict[str, Any]]:
    """The output items: the text's message (when there is text, or ``message``), then each function call."""
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    base = rid.removeprefix("resp_")
    output: list[dict[str, Any]] = []
    if reply.content or message:
        text: dict[str, Any] = {"type": "output_text", "text": reply.content, "annotations": []}
        if reply.logprobs:
            text["logprobs"] = [_logprob(lp) for lp in reply.logprobs]
        output.append(
            {"id": f"msg_{base}", "type": "message", "role": "assistant", "status": status, "content": [text]}
        )
    for i, call in enumerate(reply.tool_calls):
        output.append(
            {
                "id": f"fc_{base}_{i}",
                "type": "function_call",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return output


def _response(
    rid: str,
    created_at: int,
    model: str,
    request: ChatRequest | None,
    output: list[dict[str, Any]],
    reply: ChatReply | None,
) -> dict[str, Any]:
    """A Response object: in progress while ``reply`` is None; the request's fields echoed where it is given."""
    if reply is None:
        status = "in_progress"
    else:
        status = "incomplete" if reply.finish_reason == "length" else "completed"
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "top_logprobs": None,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
        "background": False,
        "service_tier": "default",
        "user": None,
        "usage": None,
    }
    if request is not None:
        choice = request.tool_choice
        response.update(
            tool_choice=choice if isinstance(choice, str) else {"type": "function", "name": choice["name"]},
            tools=[
                {"type": "function", "strict": None, "description": None, "parameters": None, **t["function"]}
                for t in request.tools
            ],
            temperature=request.temperature,
            top_p=request.top_p,
            max_output_tokens=request.max_tokens,
            top_logprobs=request.top_logprobs if request.logprobs else None,
        )
    if reply is not None:
        response["usage"] = {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_prompt_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        response["agentloop"] = {"token_ids": list(reply.token_ids), "chain": reply.chain, "forked": reply.forked}
    return response


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _LOGPROB_FLOOR


def _logprob(lp: TokenLogprob) -> dict[str, Any]:
    """As a Response's output_text reports it (with the token's UTF-8 bytes)."""
    return {
        "token": lp.token,
        "bytes": list(lp.token.encode()),
        "logprob": _finite(lp.logprob),
        "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": _finite(v)} for t, v in lp.top],
    }


def _delta_logprob(lp: TokenLogprob) -> dict[str, Any]:
    """As a stream's output_text events report it (no bytes)."""
    return {
        "token": lp.token,
        "logprob": _finite(lp.logprob),
        "top_logprobs": [{"token": t, "logprob": _finite(v)} for t, v in lp.top],
    }


OPENAI_RESPONSES = OpenAIResponses()
