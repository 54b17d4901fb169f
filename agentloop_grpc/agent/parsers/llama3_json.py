"""Llama 3 JSON: ``{"name": ..., "parameters": {...}}``, maybe after ``<|python_tag|>``, several joined by ``;``.

Meta's Llama 3.1-3.3 instruct models answer a custom tool with the bare JSON object as the whole turn (ended by
``<|eot_id|>``), or after ``<|python_tag|>`` (ended by ``<|eom_id|>``). A turn is calls when it starts with ``{``
or holds ``<|python_tag|>``; the text before the tag is content. ``"arguments"`` is read where ``"parameters"`` is
missing, as recent checkpoints write either.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import (
    ParsedTurn,
    ParseError,
    ToolCall,
    arguments_object,
    call_schema,
    check_offer,
    decode_json,
    json_schema_rules,
    text_before,
)

PYTHON_TAG = "<|python_tag|>"
_KEYS = ("parameters", "arguments")


class Llama3JsonParser:
    name = "llama3_json"
    stop_tokens: tuple[str, ...] = ("<|eom_id|>",)

    def parse(self, text: str) -> ParsedTurn:
        if PYTHON_TAG in text:
            content, _, body = text.partition(PYTHON_TAG)
        elif text.lstrip().startswith("{"):
            content, body = "", text
        else:
            return ParsedTurn(content=text.strip())
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        decoder = json.JSONDecoder()
        position = _skip_space(body, 0)
        while position < len(body):
            start = position
            decoded, error = decode_json(body[start:], lambda: decoder.raw_decode(body, start))  # noqa: B023 - run at once
            if error is not None:  # a malformed or cut-off call: where it ends is unknowable, so the rest goes
                errors.append(error)
                break
            value, end = decoded
            call_or_error = arguments_object(body[start:end], value, _KEYS)
            if isinstance(call_or_error, ToolCall):
                calls.append(call_or_error)
            else:
                errors.append(call_or_error)
            position = _skip_space(body, end)
            if position < len(body) and body[position] != ";":
                errors.append(ParseError(body[position:], "text follows a call; calls are separated by ';'"))
                break
            position = _skip_space(body, position + 1)
        if not calls and not errors:
            errors.append(ParseError(text, f"{PYTHON_TAG} is not followed by a call"))
        return ParsedTurn(content=content.strip(), calls=tuple(calls), errors=tuple(errors))

    def settled_content(self, text: str) -> str:
        head = text.lstrip()
        if not head or head.startswith("{"):  # maybe a turn of bare JSON calls, whose content is ""
            return ""
        return text_before(text, PYTHON_TAG)

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        # bare JSON, the documented custom-tool answer: <|python_tag|> is a special token a grammar cannot emit
        check_offer(tools, max_calls)
        return (
            f'root ::= call_json ("; " call_json){{0, {max_calls - 1}}}\n'
            + json_schema_rules(call_schema(tools, "parameters"), "call_json")
        )


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position
