"""GPT-OSS (OpenAI harmony): a turn is a run of messages; a call is a message addressed ``to=functions.NAME``.

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(one line in the model's text, broken here for width).

The generation prompt already holds the first ``<|start|>assistant``, so the turn opens on a header. The
recipient may sit in the role part (``<|start|>assistant to=functions.x<|channel|>commentary json``) or in the
channel part; both are read. A call's body is its JSON arguments, ended by ``<|call|>`` or by the end of the turn
(the loop strips the stop token that ended the turn). Content is the messages on other channels than ``analysis``
(the reasoning) that address no one. The model stops at ``<|call|>``, so a turn holds one call.

No grammar: the headers are special tokens, which the engines' grammar matcher never lets a model emit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .base import ParsedTurn, ParseError, ToolCall, arguments_object, decode_json

_MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_FUNCTIONS = "functions."


class GptOssParser:
    name = "gpt_oss"
    stop_tokens: tuple[str, ...] = ("<|call|>", "<|return|>")

    def settled_content(self, text: str) -> str:
        return ""  # which channel a message's text belongs to is known once its header is whole: sent at the end

    def parse(self, text: str) -> ParsedTurn:
        if _MESSAGE not in text and "<|channel|>" not in text:
            return ParsedTurn(content=text.strip())  # the model wrote no harmony at all: plain content
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        content: list[str] = []
        position = 0
        while position < len(text) and text[position:].strip():
            header_end = text.find(_MESSAGE, position)
            if header_end < 0:
                errors.append(ParseError(text[position:], "a message header is not followed by <|message|>"))
                break
            header = text[position:header_end]
            body_start = header_end + len(_MESSAGE)
            ends = [(text.find(end, body_start), end) for end in _ENDS if end in text[body_start:]]
            body_end, terminator = min(ends) if ends else (len(text), "")
            body = text[body_start:body_end]
            raw = text[position : body_end + len(terminator)]
            position = body_end + len(terminator)
            recipient = _RECIPIENT.search(header)
            if recipient is None:
                channel = _CHANNEL.search(header)
                if channel is None or channel.group(1) != "analysis":
                    content.append(body.strip())
                continue
            name = recipient.group(1).removeprefix(_FUNCTIONS)
            value, error = decode_json(raw, lambda: json.loads(body))  # noqa: B023 - called before the loop moves on
            if error is not None and not terminator:
                error = ParseError(raw, f"the call to {name} is cut off before its JSON ends")
            call_or_error = error or arguments_object(raw, {"name": name, "arguments": value}, ("arguments",))
            if isinstance(call_or_error, ToolCall):
                calls.append(call_or_error)
            else:
                errors.append(call_or_error)
        return ParsedTurn(content="\n".join(c for c in content if c), calls=tuple(calls), errors=tuple(errors))

    def constraint(self, tools: Sequence[dict[str, Any]], max_calls: int) -> str:
        raise ValueError("tool_parser gpt_oss has no grammar: its call headers are special tokens (<|channel|>, "
                         "<|message|>) that the grammar matcher never emits; turn constrain_tool_calls off")
