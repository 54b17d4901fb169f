"""The OpenAI Responses API's ``input`` items and ``tools`` read into the internal OpenAI-chat-shaped messages and
tool specs (exchange.py); openai_responses.py's module docstring says how each item maps."""

from __future__ import annotations

from typing import Any

from .config import GatewayLimits
from .exchange import ToolChoice
from .wire_checks import Fields, check_count, check_tools, hosted_tool, image_part, json_type, refuse, shown

#: Why ids of earlier responses and items cannot be used: the gateway keeps no Responses state.
STATELESS = "send the whole input; store is not supported"
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def read_input(value: Any, instructions: str | None, limits: GatewayLimits) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as the conversation's messages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(value, str):
        if not value:
            raise refuse("input must not be empty", "input")
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        if not value:
            raise refuse("input is empty: it must hold at least one item", "input")
        messages += _items(value)
    else:
        raise refuse(f"input must be a string or a list of items, not {json_type(value)}", "input")
    check_count(len(messages), limits.max_messages, "input", "messages (instructions included)", "max_messages")
    return messages


def _items(value: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        # Echoed items carry ids, statuses and more that mean nothing as input: unknown fields are ignored.
        item = Fields(raw, None, where)
        kind = item.get("type", "message" if "role" in item.value else None)
        if kind == "message":
            messages.append(_message(item))
        elif kind == "function_call":
            call_id = item.required_text("call_id", nonempty=True)
            if call_id in call_ids:
                raise refuse(f"{where}.call_id {shown(call_id)} is used by an earlier function_call",
                             f"{where}.call_id")
            call_ids.add(call_id)
            function = {"name": item.required_text("name", nonempty=True), "arguments": item.required_text("arguments")}
            call = {"id": call_id, "type": "function", "function": function}
            # a call joins the assistant message just before it (its text, or the calls before it)
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["tool_calls"] = [*messages[-1].get("tool_calls", ()), call]
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.required_text("call_id", nonempty=True)
            if call_id not in call_ids:
                raise refuse(f"{where}.call_id {shown(call_id)} answers no earlier function_call in input "
                             f"({STATELESS})", f"{where}.call_id")
            output = item.get("output")
            content = output if isinstance(output, str) else _collapse(_parts(output, "tool", f"{where}.output"))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise refuse(f"{where}: item_reference is not supported: {STATELESS}", f"{where}.type")
        elif isinstance(kind, str):
            raise refuse(f"{where}.type {shown(kind)} is not supported (message, function_call, "
                         "function_call_output and reasoning items are)", f"{where}.type")
        else:
            raise refuse(f"{where} must have a type or a role", f"{where}.type")
    return messages


def _message(item: Fields) -> dict[str, Any]:
    role = item.one_of("role", list(_ROLES), required=True)
    assert role is not None  # required: None raised
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    parts = _parts(content, role, item.path("content"))
    if role == "assistant":
        # The model's text is one string (a reply is one output_text part): the template renders it as one.
        return {"role": "assistant", "content": "".join(p["text"] for p in parts)}
    return {"role": _ROLES[role], "content": _collapse(parts)}


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part alone as its string: every chat template renders a string content; not every one a list."""
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _parts(value: Any, role: str, where: str) -> list[dict[str, Any]]:
    """A content list as internal parts."""
    if not isinstance(value, list):
        raise refuse(f"{where} must be a string or a list of content parts, not {json_type(value)}", where)
    if not value:
        raise refuse(f"{where} is empty: it must hold at least one part", where)
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(value):
        part = Fields(raw, None, f"{where}[{j}]")  # echoed annotations and logprobs are ignored
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part.required_text("text")})
        elif kind == "input_image" and role != "assistant":
            if part.get("file_id") is not None:
                raise refuse(f"{part.path('file_id')} is not supported: send the image as a data URL in image_url",
                             part.path("file_id"))
            url = part.text("image_url")
            if url is None:
                raise refuse(f"{part.path('image_url')} is required (a data URL)", part.path("image_url"))
            parts.append(image_part(url, part.path("image_url")))
        else:
            raise refuse(f"{part.path('type')} {shown(kind)} is not supported in a {role} message (input_text, "
                         "output_text and input_image, the last not from the assistant, are)", part.path("type"))
    return parts


def read_tools(value: list[Any] | None, limits: GatewayLimits) -> tuple[dict[str, Any], ...]:
    """Function tools (OpenAI's Responses shape: the function's fields on the tool itself); hosted tools are left
    out and recorded."""
    if value is None:
        return ()
    check_count(len(value), limits.max_tools, "tools", "tools", "max_tools")
    return check_tools(value, "tools", _function_of, name_at="name", schema_at="parameters")


def _function_of(raw: Any, where: str) -> dict[str, Any] | None:
    tool = Fields(raw, None, where)
    if tool.get("type") != "function":
        hosted_tool(tool.get("type"), where)
        return None
    tool.flag("strict")  # checked, then ignored: no constrained decoding
    function: dict[str, Any] = {"name": tool.required_text("name")}
    if tool.get("description") is not None:
        function["description"] = tool.text("description")
    if tool.get("parameters") is not None:
        function["parameters"] = tool.get("parameters")
    return function


def read_tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> ToolChoice:
    if value is None or value in ("auto", "none"):
        return value or "auto"
    if value == "required":
        if not tools:
            raise refuse("tool_choice 'required' needs tools", "tool_choice")
        return "required"
    if isinstance(value, dict):
        choice = Fields(value, None, "tool_choice")
        if choice.get("type") != "function":
            raise refuse(f"tool_choice.type {shown(choice.get('type'))} is not supported (auto, none, required or "
                         "a function)", "tool_choice.type")
        name = choice.get("name")
        if not any(tool["function"]["name"] == name for tool in tools):
            raise refuse(f"tool_choice.name {shown(name)} is not among the function tools offered",
                         "tool_choice.name")
        return {"name": name}
    raise refuse(f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}, "
                 f"not {shown(value)}", "tool_choice")
