"""Tool-call parsers: model text -> tool calls, behind one small interface so other formats can join.

A parser also knows its format's grammar: ``constraint`` returns an EBNF grammar (xgrammar's dialect, which the
embedded engine and vLLM both accept) that forces a turn to be well-formed calls of the offered tools. A small
model needs it (the default 135M model produced 0 parseable calls in 40 unconstrained tries).

A malformed call is not dropped: it comes back as a ``ParseError`` and the loop answers it with a tool-error
message the model reads (and counts it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
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

    def parse(self, text: str) -> ParsedTurn: ...

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        """An EBNF grammar (xgrammar dialect) of a turn made of 1..max_calls calls of ``tools`` (OpenAI specs)."""
        ...


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn (Hermes / Qwen format)."""

    name = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        for match in _BLOCK.finditer(text):
            raw = match.group(0)
            call_or_error = _parse_call(raw, match.group(1))
            (calls if isinstance(call_or_error, ToolCall) else errors).append(call_or_error)
        rest = _BLOCK.sub("", text)
        if _OPEN in rest:
            dangling = rest[rest.index(_OPEN) :]
            errors.append(ParseError(dangling, "a <tool_call> block is not closed with </tool_call>"))
            rest = rest[: rest.index(_OPEN)]
        return ParsedTurn(content=rest.strip(), calls=tuple(calls), errors=tuple(errors))

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        import xgrammar  # the engines' grammar dialect; imported only when a constraint is asked for

        if not tools or max_calls < 1:
            raise ValueError("a tool-call constraint needs at least one tool and max_calls >= 1")
        call_schema = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": tool["function"]["name"]},
                        "arguments": tool["function"].get("parameters") or {"type": "object"},
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for tool in tools
            ]
        }
        json_rules = str(xgrammar.Grammar.from_json_schema(json.dumps(call_schema), any_whitespace=False))
        json_rules = re.sub(r"\broot\b", "tool_call_json", json_rules)
        return (
            f'root ::= tool_call_block ("\\n" tool_call_block){{0, {max_calls - 1}}}\n'
            'tool_call_block ::= "<tool_call>\\n" tool_call_json "\\n</tool_call>"\n' + json_rules
        )


def _parse_call(raw: str, body: str) -> ToolCall | ParseError:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        return ParseError(raw, f"the call is not valid JSON ({error.msg} at character {error.pos})")
    except (RecursionError, ValueError):  # nesting past the decoder's recursion, an integer past the digit limit
        return ParseError(raw, "the call is nested too deeply or holds a number too long to read")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ParseError(raw, 'the call must be a JSON object with a string "name"')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ParseError(raw, '"arguments" is a string that is not JSON')
    if not isinstance(arguments, dict):
        return ParseError(raw, '"arguments" must be a JSON object')
    return ToolCall(name=value["name"], arguments=arguments, raw=raw)
