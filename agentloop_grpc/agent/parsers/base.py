"""What every tool-call format shares: the parsed types, the parser interface, and grammar helpers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(hash=False)
    #: The call's text as the model wrote it.
    raw: str = ""

    def openai(self, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ParseError:
    raw: str
    reason: str


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    #: The text outside any call.
    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ParseError, ...] = ()


class ToolCallParser(Protocol):
    name: str
    #: Special tokens that end a turn after a call, beyond the template's end of turn (Llama's ``<|eom_id|>``,
    #: GPT-OSS's ``<|call|>``). The loop adds the ids of those the tokenizer holds as one token to every turn's
    #: stop ids; a tokenizer without them still gets its text parsed, the call then ending at the end of turn.
    stop_tokens: tuple[str, ...]

    def parse(self, text: str) -> ParsedTurn:
        """The complete calls of one finished turn; a malformed or cut-off call is a ParseError, never half a call."""
        ...

    def settled_content(self, text: str) -> str:
        """What of a turn's text so far is content whatever the model writes next: ``parse`` of the finished turn
        gives a content that starts with it, so a streaming client may be sent it before the turn ends ("" where
        the format cannot tell before the end)."""
        ...

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        """An EBNF grammar (xgrammar dialect) of a turn made of 1..max_calls calls of ``tools`` (OpenAI specs)."""
        ...


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


def tool_call_blocks(text: str, read: Callable[[str, str], ToolCall | ParseError]) -> ParsedTurn:
    """A turn of ``<tool_call>...</tool_call>`` blocks (Hermes, Qwen3-Coder): ``read(raw, body)`` reads each; an
    unclosed block at the end (a cut-off call) is an error; the text outside blocks is the content."""
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    for match in _BLOCK.finditer(text):
        call_or_error = read(match.group(0), match.group(1))
        if isinstance(call_or_error, ToolCall):
            calls.append(call_or_error)
        else:
            errors.append(call_or_error)
    rest = _BLOCK.sub("", text)
    if _OPEN in rest:
        dangling = rest[rest.index(_OPEN) :]
        errors.append(ParseError(dangling, "a <tool_call> block is not closed with </tool_call>"))
        rest = rest[: rest.index(_OPEN)]
    return ParsedTurn(content=rest.strip(), calls=tuple(calls), errors=tuple(errors))


def text_before(text: str, marker: str) -> str:
    """The settled content of a format whose calls start with ``marker`` and whose content is the stripped text
    outside them: ``text`` up to ``marker`` (or up to an end that may grow into it), stripped."""
    at = text.find(marker)
    if at < 0:
        at = next((len(text) - k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                   if text.endswith(marker[:k])), len(text))
    return text[:at].strip()


def blocks_settled_content(text: str) -> str:
    """``settled_content`` of the formats of ``<tool_call>`` blocks (``tool_call_blocks``)."""
    return text_before(text, _OPEN)


def check_offer(tools: Sequence[dict[str, Any]], max_calls: int) -> None:
    if not tools or max_calls < 1:
        raise ValueError("a tool-call constraint needs at least one tool and max_calls >= 1")


def arguments_object(raw: str, value: Any, keys: tuple[str, ...]) -> ToolCall | ParseError:
    """A decoded JSON call ``{"name": ..., <key>: {...}}`` (the first of ``keys`` present) as a ToolCall."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ParseError(raw, 'the call must be a JSON object with a string "name"')
    key = next((k for k in keys if k in value), keys[0])
    arguments = value.get(key, {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ParseError(raw, f'"{key}" is a string that is not JSON')
    if not isinstance(arguments, dict):
        return ParseError(raw, f'"{key}" must be a JSON object')
    return ToolCall(name=value["name"], arguments=arguments, raw=raw)


def decode_json(raw: str, decode: Callable[[], Any]) -> tuple[Any, ParseError | None]:
    """Run a JSON decode, turning every way it fails on model text into a ParseError."""
    try:
        return decode(), None
    except json.JSONDecodeError as error:
        return None, ParseError(raw, f"the call is not valid JSON ({error.msg} at character {error.pos})")
    except (RecursionError, ValueError):  # nesting past the decoder's recursion, an integer past the digit limit
        return None, ParseError(raw, "the call is nested too deeply or holds a number too long to read")


# A grammar's string literals and character classes, skipped, and its identifiers, renamed.
_GRAMMAR_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z_][A-Za-z0-9_]*')


def prefixed_rules(grammar: str, name: str) -> str:
    """``grammar`` with its root renamed ``name`` and every other rule ``name_<rule>``, so that grammars made
    apart (one per JSON schema) can join one grammar without their helper rules colliding."""
    defined = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*) ::=", grammar, re.MULTILINE))

    def rename(match: re.Match[str]) -> str:
        token = match.group(0)
        if token not in defined:
            return token
        return name if token == "root" else f"{name}_{token}"

    return _GRAMMAR_TOKEN.sub(rename, grammar)


def json_schema_rules(schema: dict[str, Any], name: str) -> str:
    """Rules for JSON text of ``schema`` (compact, as the formats' samples write it), rooted at ``name``."""
    import xgrammar  # the engines' grammar dialect; imported only when a constraint is asked for

    return prefixed_rules(str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)), name)


def call_schema(tools: Sequence[dict[str, Any]], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call ``{"name": <an offered tool>, <arguments_key>: <its parameters>}``."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    arguments_key: tool["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
            for tool in tools
        ]
    }


def literal(text: str) -> str:
    """``text`` as an EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)
