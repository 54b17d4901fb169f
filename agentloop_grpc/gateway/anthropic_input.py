"""Anthropic Messages ``system``, ``messages``, ``tools`` and ``tool_choice`` read into the internal OpenAI-chat-shaped
messages and tool specs (exchange.py); anthropic_messages.py's module docstring says how each block maps."""

from __future__ import annotations

import json
from typing import Any

from .config import GatewayLimits
from .exchange import ToolChoice
from .wire_checks import Fields, check_count, check_tools, hosted_tool, ignore, image_part, json_type, refuse, shown

#: Anthropic's image types.
_IMAGE_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")
#: The keys of a custom tool the gateway reads (``cache_control`` and ``strict`` are accepted and ignored).
_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict",
                          "defer_loading"})


def _block(value: Any, where: str) -> tuple[Fields, str]:
    """A content block and its type (blocks echoed from a reply may carry fields the gateway ignores)."""
    block = Fields(value, None, where)
    return block, block.required_text("type")


def _blocks(value: Any, where: str) -> str | list[Any]:
    """A content that is a string or a non-empty list of blocks (a string is returned as it is)."""
    if isinstance(value, list):
        if not value:
            raise refuse(f"{where} is empty: it must hold at least one block", where)
        return value
    if not isinstance(value, str):
        raise refuse(f"{where} must be a string or an array of blocks, not {json_type(value)}", where)
    return value


def system_text(value: Any, where: str = "system") -> str:
    """A system prompt (a string or text blocks) as one string, its blocks joined by a blank line."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise refuse(f"{where} must be a string or an array of text blocks, not {json_type(value)}", where)
    texts = []
    for i, item in enumerate(value):
        block, kind = _block(item, f"{where}[{i}]")
        if kind != "text":
            raise refuse(f"{where}[{i}].type must be text, not {shown(kind)}", f"{where}[{i}].type")
        texts.append(block.required_text("text"))
    return "\n\n".join(texts)


def read_messages(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        message = Fields(item, ("role", "content"), f"messages[{i}]")
        role = message.one_of("role", ("user", "assistant", "system"), required=True)
        content = _blocks(message.get("content"), message.path("content"))
        if role == "user":
            out.extend(_user(content, message.path("content")))
        elif role == "system":  # a system message among the messages keeps its place
            out.append({"role": "system", "content": system_text(content, message.path("content"))})
        else:
            out.append(_assistant(content, message.path("content")))
    return out


def _user(content: str | list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic user message: its tool results first, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for i, value in enumerate(content):
        block, kind = _block(value, f"{where}[{i}]")
        if kind == "tool_result":
            results.append(_tool_result(block))
        elif kind in ("text", "image"):
            rest.append(_part(block, kind))
        elif kind == "tool_use":
            raise refuse(f"{block.where}: a tool_use block belongs in an assistant message", block.path("type"))
        else:
            raise refuse(f"{block.path('type')} {kind!r:.80} is not supported in a user message (text, image, "
                         "tool_result)", block.path("type"))
    return results + ([{"role": "user", "content": rest}] if rest else [])


def _assistant(content: str | list[Any], where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, value in enumerate(content):
        block, kind = _block(value, f"{where}[{i}]")
        if kind == "text":
            texts.append(block.required_text("text"))
        elif kind == "tool_use":
            arguments = json.dumps(block.mapping("input", required=True))
            function = {"name": block.required_text("name", nonempty=True), "arguments": arguments}
            calls.append({"id": block.required_text("id", nonempty=True), "type": "function", "function": function})
        elif kind == "tool_result":
            raise refuse(f"{block.where}: a tool_result block belongs in a user message", block.path("type"))
        elif kind in ("thinking", "redacted_thinking"):
            ignore(f"{where}[{i}].type={kind}")  # the gateway wrote none: no part of the session's token record
        else:
            raise refuse(f"{block.path('type')} {kind!r:.80} is not supported in an assistant message (text, "
                         "tool_use)", block.path("type"))
    # The model's text is one string, as the chat template renders it (a reply holds one text block).
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _parts(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Text and image blocks (a tool result's content) as internal parts."""
    parts: list[dict[str, Any]] = []
    for i, value in enumerate(blocks):
        block, kind = _block(value, f"{where}[{i}]")
        if kind not in ("text", "image"):
            raise refuse(f"{block.path('type')} {kind!r:.80} is not supported here (text or image)",
                         block.path("type"))
        parts.append(_part(block, kind))
    return parts


def _part(block: Fields, kind: str) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text", "text": block.required_text("text")}
    source = Fields(block.get("source"), None, block.path("source"))
    kind = source.required_text("type")
    if kind in ("url", "file"):
        raise refuse(f"{source.where}: {kind} image sources are not supported (the gateway fetches nothing); send "
                     "the image as base64", source.where)
    if kind != "base64":
        raise refuse(f"{source.path('type')} must be base64, not {kind!r:.80}", source.path("type"))
    media_type = source.one_of("media_type", _IMAGE_TYPES, required=True)
    data = source.required_text("data", nonempty=True)
    return image_part(f"data:{media_type};base64,{data}", source.path("data"))


def _tool_result(block: Fields) -> dict[str, Any]:
    call_id = block.required_text("tool_use_id", nonempty=True)
    raw = block.get("content", "")
    content: str | list[dict[str, Any]]
    if isinstance(raw, str):
        content = raw
    elif isinstance(raw, list):
        content = _parts(raw, block.path("content"))
    else:
        raise refuse(f"{block.path('content')} must be a string or an array of blocks, not {json_type(raw)}",
                     block.path("content"))
    if block.flag("is_error"):  # the model must read it as a failure, without a field of its own
        if isinstance(content, str):
            content = f"Error: {content}" if content else "Error"
        elif content and content[0]["type"] == "text":
            content = [{"type": "text", "text": f"Error: {content[0]['text']}"}, *content[1:]]
        else:
            content = [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def read_tools(value: list[Any], limits: GatewayLimits) -> tuple[dict[str, Any], ...]:
    """Custom tools as OpenAI function specs; server tools and deferred tools are left out and recorded."""
    check_count(len(value), limits.max_tools, "tools", "tools", "max_tools")
    return check_tools(value, "tools", _function_of, name_at="name", schema_at="input_schema", max_name=128)


def _function_of(raw: Any, where: str) -> dict[str, Any] | None:
    if isinstance(raw, dict) and raw.get("type", "custom") not in ("custom", None):
        hosted_tool(raw["type"], where)  # server and built-in tools run at Anthropic
        return None
    tool = Fields(raw, _TOOL_FIELDS, where)
    if tool.flag("defer_loading"):  # Anthropic shows it to the model only once a tool search loads it
        ignore(f"{where}.defer_loading")
        return None
    name = tool.required_text("name")
    description = tool.text("description") or ""
    schema = tool.mapping("input_schema", required=True)
    assert schema is not None  # required: None raised
    if schema.get("type") != "object":
        raise refuse(f"{where}.input_schema.type must be 'object'", f"{where}.input_schema.type")
    return {"name": name, "description": description, "parameters": schema}


def read_tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> ToolChoice:
    choice = Fields(value, ("type", "name", "disable_parallel_tool_use"), "tool_choice")
    choice.flag("disable_parallel_tool_use")  # checked, then ignored: the model's calls are what it wrote
    kind = choice.one_of("type", ("auto", "any", "tool", "none"), required=True)
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if not tools:
        raise refuse(f"tool_choice {kind!r} needs tools", "tool_choice")
    if kind == "any":
        return "required"
    name = choice.required_text("name", nonempty=True)
    if not any(tool["function"]["name"] == name for tool in tools):
        raise refuse(f"tool_choice.name {name!r:.80} is not one of the tools offered", "tool_choice.name")
    return {"name": name}
