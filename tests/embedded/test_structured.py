"""Structured output through xgrammar: valid JSON tool calls, regexes, grammars, and compile errors."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentloop_grpc.engine_adapters.errors import DuplicateRequestError, InvalidRequestError
from agentloop_grpc.engine_adapters.types import StructuredOutput

from .helpers import chat, generate, make, run

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "add"},
        "arguments": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


async def test_json_schema_yields_a_valid_tool_call(engine, tokenizer) -> None:
    prompt = chat(tokenizer, "What is 17 plus 23?", tools=TOOLS) + tokenizer.encode("<tool_call>\n")
    constraint = StructuredOutput("json_schema", json.dumps(CALL_SCHEMA))
    for seed in (0, 1):
        result = await generate(engine, prompt, constraint, max_new_tokens=60, seed=seed)
        assert result.complete.finish_reason.value == "stop"
        assert result.tokens[-1] == tokenizer.eos_token_id
        call = json.loads(tokenizer.decode(result.tokens[:-1]))
        assert call["name"] == "add" and set(call["arguments"]) == {"a", "b"}
        assert all(isinstance(v, int) for v in call["arguments"].values())


async def test_regex_and_grammar(engine, tokenizer) -> None:
    prompt = chat(tokenizer, "Pick a number.")
    digits = await generate(engine, prompt, StructuredOutput("regex", r"[0-9]{3}"), max_new_tokens=10, seed=2)
    assert re.fullmatch(r"[0-9]{3}", tokenizer.decode(digits.tokens[:-1]))
    grammar = 'root ::= "yes" | "no"'
    answer = await generate(engine, prompt, StructuredOutput("ebnf_grammar", grammar), max_new_tokens=5, seed=2)
    assert tokenizer.decode(answer.tokens[:-1]) in {"yes", "no"}


@pytest.mark.parametrize(
    ("kind", "spec"),
    [("json_schema", '{"type": "nosuchtype"}'), ("regex", "(unclosed"), ("ebnf_grammar", "root ::= undefined_rule")],
)
async def test_constraints_that_do_not_compile_are_invalid(engine, tokenizer, kind, spec) -> None:
    with pytest.raises(InvalidRequestError, match=kind):
        await generate(engine, chat(tokenizer, "Hi"), StructuredOutput(kind, spec), max_new_tokens=4)
    assert engine.load().running_requests == 0


async def test_a_duplicate_id_is_refused_while_the_first_compiles(engine, tokenizer) -> None:
    """The id was registered only once compiled: a second request with it ran too, and took the first's place."""
    request = make(chat(tokenizer, "Pick a number."), StructuredOutput("regex", r"[0-9]{2}"), max_new_tokens=4)
    first = asyncio.create_task(run(engine, request))
    await asyncio.sleep(0)  # the first is compiling now
    with pytest.raises(DuplicateRequestError, match=request.request_id):
        await run(engine, request)
    assert (await first).complete.finish_reason.value == "stop"
