"""How a request's messages relate to what a session's chain already holds: append or fork, and the template's
view of the messages that enter the token context.

A chain remembers the conversation as the client should echo it back: each request's messages and each reply as
the gateway sent it, in a canonical form. A request *appends* when its messages start with that history and go on
with messages that are not the assistant's (tool results, user turns): only those are encoded. Anything else
forks. The canonical form makes an echo match however the client re-serialised it: an assistant turn is compared
by its text with whitespace collapsed and its calls' names and parsed arguments (ids are the client's to rename,
JSON key order and spacing its to change); a tool result by its content (its call id may be renamed too). The
assistant's tokens are never taken from the echo: the chain holds the ids the engine produced.

The template's view: the shape our loops render (``agent/loops/tool_loop.py``): a tool result is
``{"role": "tool", "name": <the call's function>, "content": ...}``; an assistant message from the client (only in
a new chain's prompt) keeps its calls with parsed arguments, as chat templates render them. Images must be data
URLs: a path would read the gateway's own files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .exchange import GatewayError

#: A message as compared for append: (role, content, calls).
Canonical = tuple[str, Any, tuple[tuple[str, str], ...]]


def canonical(message: dict[str, Any]) -> Canonical:
    role = message.get("role", "")
    if role == "assistant":
        calls = tuple((_call_name(c), _arguments_key(c)) for c in message.get("tool_calls") or ())
        return role, " ".join(_text(message.get("content")).split()), calls
    return role, _content_key(message.get("content")), ()


@dataclass(frozen=True, slots=True)
class Match:
    """How a request relates to one chain: ``appends`` with ``new`` messages, or the reason it does not."""

    new: tuple[dict[str, Any], ...] = ()
    reason: str | None = None

    @property
    def appends(self) -> bool:
        return self.reason is None


def match(seen: Sequence[Canonical], messages: Sequence[dict[str, Any]]) -> Match:
    """Whether ``messages`` continue a chain whose client-visible history is ``seen`` (ending with its last reply)."""
    keys = [canonical(m) for m in messages]
    for i, (had, got) in enumerate(zip(seen, keys)):
        if had != got:
            return Match(reason=f"history differs from the chain at message {i} (edited, compacted or dropped turns)")
    if len(keys) <= len(seen):
        return Match(reason=f"{len(keys)} messages, no more than the chain's {len(seen)} (a retry or a shortened "
                            "history)")
    new = tuple(messages[len(seen):])
    for i, message in enumerate(new, start=len(seen)):
        if message.get("role") == "assistant":
            return Match(reason=f"message {i} is an assistant turn the gateway did not produce")
    return Match(new=new)


def tools_key(tools: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(tools), sort_keys=True, separators=(",", ":"))


def template_view(messages: Sequence[dict[str, Any]], context: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """``messages`` as the chat template renders them; ``context``: earlier messages of the same request, where the
    calls that tool results answer are found (by id, else by position after the last assistant turn)."""
    names = _call_names([*context, *messages])
    calls: list[dict[str, Any]] = []  # the last assistant turn's calls, for results without a known id
    position = 0
    for message in context:
        if message.get("role") == "assistant":
            calls, position = list(message.get("tool_calls") or ()), 0
        elif message.get("role") == "tool":
            position += 1
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        _check_images(message)
        if role == "tool":
            name = names.get(message.get("tool_call_id") or "") or message.get("name") or ""
            if not name and position < len(calls):
                name = _call_name(calls[position])
            out.append({"role": "tool", "name": name, "content": _tool_content(message.get("content"))})
            position += 1
        elif role == "assistant":
            calls, position = list(message.get("tool_calls") or ()), 0
            view: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
            if calls:
                view["tool_calls"] = [
                    {"type": "function", "function": {"name": _call_name(c), "arguments": _arguments(c)}}
                    for c in calls
                ]
            out.append(view)
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    return out


def _call_names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    return {c.get("id", ""): _call_name(c) for m in messages for c in (m.get("tool_calls") or ()) if c.get("id")}


def _call_name(call: dict[str, Any]) -> str:
    return str((call.get("function") or {}).get("name", ""))


def _arguments(call: dict[str, Any]) -> Any:
    raw = (call.get("function") or {}).get("arguments", "")
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def _arguments_key(call: dict[str, Any]) -> str:
    arguments = _arguments(call)
    if isinstance(arguments, str):  # not JSON: compared as text, whitespace collapsed
        return " ".join(arguments.split())
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content if p.get("type") == "text")


def _content_key(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") == "image":
            parts.append(("image", hashlib.sha256(str(part.get("image")).encode()).hexdigest()))
        else:
            parts.append(("text", part.get("text") or ""))
    if all(kind == "text" for kind, _ in parts):  # text parts and the same text as a string are one message
        return "".join(text for _, text in parts)
    return tuple(parts)


def _tool_content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    if all(p.get("type") == "text" for p in content):
        return "".join(p.get("text") or "" for p in content)
    return [dict(p) for p in content]


def _check_images(message: dict[str, Any]) -> None:
    content = message.get("content")
    if not isinstance(content, list):
        return
    for part in content:
        if part.get("type") == "image" and not (isinstance(part.get("image"), str)
                                                and part["image"].startswith("data:")):
            raise GatewayError("an image must be a data URL (data:<mime type>;base64,...): the gateway fetches "
                               "nothing", param="messages")
