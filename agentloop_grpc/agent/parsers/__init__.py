"""Tool-call parsers: model text -> tool calls, one per format, chosen per run by ``AgentLoopConfig.tool_parser``.

A parser also knows its format's grammar: ``constraint`` returns an EBNF grammar (xgrammar's dialect, which the
embedded engine and vLLM both accept) that forces a turn to be well-formed calls of the offered tools. A small
model needs it (the default 135M model produced 0 parseable calls in 40 unconstrained tries). A format whose calls
are written in special tokens has none, and the config refuses ``constrain_tool_calls`` with it.

A parser reads a finished turn and returns only complete calls: a malformed or cut-off call is not dropped but
comes back as a ``ParseError``, and the loop answers it with a tool-error message the model reads (and counts it).
A format's call-ending special tokens (``stop_tokens``) join the turn's stop ids where the tokenizer has them.

The model's text is never rewritten: the conversation keeps each assistant turn as the tokens the model produced,
whatever the format, so parsing changes only what the loop does, not the trajectory's ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from .base import ParsedTurn, ParseError, ToolCall, ToolCallParser
from .gpt_oss import GptOssParser
from .hermes import HermesParser
from .llama3_json import Llama3JsonParser
from .qwen3_coder import Qwen3CoderParser

ParserName = Literal["hermes", "qwen3_coder", "llama3_json", "gpt_oss"]

__all__ = [
    "GptOssParser", "HermesParser", "Llama3JsonParser", "ParseError", "ParsedTurn", "ParserName", "Qwen3CoderParser",
    "ToolCall", "ToolCallParser", "make_parser", "stop_token_ids",
]


def make_parser(name: ParserName, tools: Sequence[dict[str, Any]] = ()) -> ToolCallParser:
    """The parser of format ``name``; ``tools`` (OpenAI specs) type the values of formats that write them as text."""
    if name == "hermes":
        return HermesParser()
    if name == "qwen3_coder":
        return Qwen3CoderParser(tools)
    if name == "llama3_json":
        return Llama3JsonParser()
    if name == "gpt_oss":
        return GptOssParser()
    raise ValueError(f"tool_parser {name!r} is not one of hermes, qwen3_coder, llama3_json, gpt_oss")


def stop_token_ids(parser: ToolCallParser, encode: Callable[[str], list[int]]) -> tuple[int, ...]:
    """The ids of the parser's stop tokens that ``encode`` (the tokenizer's) reads as one token; others are skipped
    (that tokenizer cannot produce them as one token, so a model of it never stops on them)."""
    ids = [encode(token) for token in parser.stop_tokens]
    return tuple(sorted({i[0] for i in ids if len(i) == 1}))
