"""Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn (Hermes, Qwen2.5, Qwen3)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import (
    ParsedTurn,
    ParseError,
    ToolCall,
    arguments_object,
    blocks_settled_content,
    call_schema,
    check_offer,
    decode_json,
    json_schema_rules,
    tool_call_blocks,
)


class HermesParser:
    """The calls end with ``</tool_call>`` in text; the turn ends at the template's end of turn."""

    name = "hermes"
    stop_tokens: tuple[str, ...] = ()

    def parse(self, text: str) -> ParsedTurn:
        return tool_call_blocks(text, _read)

    def settled_content(self, text: str) -> str:
        return blocks_settled_content(text)

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        check_offer(tools, max_calls)
        return (
            f'root ::= tool_call_block ("\\n" tool_call_block){{0, {max_calls - 1}}}\n'
            'tool_call_block ::= "<tool_call>\\n" tool_call_json "\\n</tool_call>"\n'
            + json_schema_rules(call_schema(tools, "arguments"), "tool_call_json")
        )


def _read(raw: str, body: str) -> ToolCall | ParseError:
    value, error = decode_json(raw, lambda: json.loads(body))
    return error or arguments_object(raw, value, ("arguments",))

