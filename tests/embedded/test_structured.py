"""Structured output through xgrammar: valid JSON tool calls, regexes, grammars, compile errors, and compilations
bounded in time and stopped with their request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import psutil
import pytest

from agentloop_grpc.common.errors import DuplicateRequestError, InvalidRequestError
from agentloop_grpc.common.types import ALL_RESOURCES, FinishReason, StructuredOutput
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.embedded.engine import EmbeddedEngine
from agentloop_grpc.engine_adapters.embedded.structured import GrammarCompiler

from .helpers import chat, generate, make, run

#: A grammar well within the contract's bounds that xgrammar compiles far longer than any test here waits: token
#: masks for every position of six long bounded repeats.
PATHOLOGICAL = StructuredOutput(
    "ebnf_grammar", "root ::= " + " ".join(f'[^"]{{0,{300 + i}}} "x"' for i in range(6))
)

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


@pytest.mark.fault
async def test_a_duplicate_id_is_refused_while_the_first_compiles(engine, tokenizer) -> None:
    """The id was registered only once compiled: a second request with it ran too, and took the first's place."""
    request = make(chat(tokenizer, "Pick a number."), StructuredOutput("regex", r"[0-9]{2}"), max_new_tokens=4)
    first = asyncio.create_task(run(engine, request))
    await asyncio.sleep(0)  # the first is compiling now
    with pytest.raises(DuplicateRequestError, match=request.request_id):
        await run(engine, request)
    assert (await first).complete.finish_reason.value == "stop"


def _cpu_s() -> float:
    """CPU seconds used so far by this process and its live children: the engine and its grammar compilers."""
    me = psutil.Process()
    used = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            used += sum(child.cpu_times()[:2])
    return used


@pytest.mark.fault
async def test_a_compilation_stops_when_its_request_is_cancelled(engine, tokenizer) -> None:
    """A compilation ran on after its caller gave up, using both cores, and GetLoad did not show it."""
    task = asyncio.create_task(run(engine, make(chat(tokenizer, "Hi"), PATHOLOGICAL, max_new_tokens=4)))
    await asyncio.sleep(1.5)
    load_while_compiling = engine.load().waiting_requests
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)
    before = _cpu_s()
    await asyncio.sleep(4)
    used = _cpu_s() - before
    assert used < 0.4, f"{used:.2f} CPU seconds in 4 s: something still computes"  # an idle engine uses ~none
    assert load_while_compiling == 1 and engine.load().waiting_requests == 0
    # a new compiler process serves the next constraint
    prompt = chat(tokenizer, "Pick a number.")
    digits = await asyncio.wait_for(generate(engine, prompt, StructuredOutput("regex", "[0-7]{2}"), seed=1), 120)
    assert re.fullmatch("[0-7]{2}", tokenizer.decode(digits.tokens[:-1]))


@pytest.mark.fault
async def test_abort_ends_a_request_while_it_compiles(engine, tokenizer) -> None:
    request = make(chat(tokenizer, "Hi"), PATHOLOGICAL, max_new_tokens=4)
    task = asyncio.create_task(run(engine, request))
    async with asyncio.timeout(30):
        while engine.load().waiting_requests == 0:
            await asyncio.sleep(0.01)
    assert await engine.abort([request.request_id]) == [request.request_id]
    result = await asyncio.wait_for(task, 30)
    assert result.complete.finish_reason is FinishReason.ABORT and result.tokens == []
    assert engine.load().waiting_requests == 0


async def test_requests_sharing_a_constraint_share_its_compilation(engine, tokenizer) -> None:
    """Cancelling one request leaves the compilation to the other, which still gets its grammar."""
    prompt = chat(tokenizer, "Pick a number.")
    constraint = StructuredOutput("regex", "[1-6]{2}")
    cancelled = asyncio.create_task(generate(engine, prompt, constraint, seed=3))
    kept = asyncio.create_task(generate(engine, prompt, constraint, seed=3))
    await asyncio.sleep(0)
    cancelled.cancel()
    result = await asyncio.wait_for(kept, 120)
    assert re.fullmatch("[1-6]{2}", tokenizer.decode(result.tokens[:-1]))


@pytest.mark.fault
async def test_a_compilation_past_its_time_or_size_bound_is_invalid(engine, tokenizer) -> None:
    timed = EmbeddedEngineConfig(grammar_workers=1, grammar_compile_timeout_s=1, grammar_max_bytes=1 << 20)
    compiler = GrammarCompiler(tokenizer, engine.facts.vocab_size, timed)
    try:
        with pytest.raises(InvalidRequestError, match="ebnf_grammar did not compile within 1 s"):
            await compiler.compile(PATHOLOGICAL)
    finally:
        await compiler.close()
    # the size bound with time to spare: on a loaded machine the large regex alone can take over a second to compile,
    # and then the time bound, not the size bound, would refuse it
    sized = EmbeddedEngineConfig(grammar_workers=1, grammar_compile_timeout_s=120, grammar_max_bytes=1 << 20)
    compiler = GrammarCompiler(tokenizer, engine.facts.vocab_size, sized)
    try:
        with pytest.raises(InvalidRequestError, match=r"regex compiles to .* bytes of token masks; at most 1048576"):
            await compiler.compile(StructuredOutput("regex", "[a-z]{1,10000}"))
        assert (await compiler.compile(StructuredOutput("regex", "[0-9]"))).memory_size_bytes > 0
    finally:
        await compiler.close()


def _compiler_processes() -> set[int]:
    """Pids of this process's live grammar compilers (an exited one may linger as a zombie until reaped)."""
    pids = set()
    for child in psutil.Process().children():
        # A child may exit, turn zombie or be reaped while listed: then it is no live compiler.
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
            if child.status() != psutil.STATUS_ZOMBIE and any("grammar_worker" in p for p in child.cmdline()):
                pids.add(child.pid)
    return pids


async def test_sleep_stops_the_compiler_processes_and_a_constraint_compiles_after_wake(engine, tokenizer) -> None:
    prompt = chat(tokenizer, "Pick a number.")
    await generate(engine, prompt, StructuredOutput("regex", "[2-5]{2}"), seed=4)
    # this engine's: another engine of the test session (the MoE routing tests' server) keeps its own
    assert engine.adapter._loaded is not None
    mine = engine.adapter._loaded.grammars.process_ids()
    assert mine and mine <= _compiler_processes()
    await engine.sleep(1)
    assert not engine.adapter._loaded.grammars.process_ids()
    async with asyncio.timeout(30):
        while mine & _compiler_processes():  # their memory goes back with the KV cache's
            await asyncio.sleep(0.05)
    await engine.wake_up(ALL_RESOURCES)
    result = await asyncio.wait_for(generate(engine, prompt, StructuredOutput("regex", "[3-6]{2}"), seed=4), 120)
    assert re.fullmatch("[3-6]{2}", tokenizer.decode(result.tokens[:-1]))


@pytest.mark.fault
async def test_a_compilation_cancelled_while_its_process_starts_leaves_no_process(engine, tokenizer) -> None:
    engines = _compiler_processes()
    compiler = GrammarCompiler(tokenizer, engine.facts.vocab_size, EmbeddedEngineConfig(grammar_workers=1))
    task = asyncio.create_task(compiler.compile(StructuredOutput("regex", "[0-9]")))
    async with asyncio.timeout(30):
        while not _compiler_processes() - engines:  # started, loading xgrammar
            await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    async with asyncio.timeout(30):
        while _compiler_processes() - engines:
            await asyncio.sleep(0.05)
    await compiler.close()


async def test_an_engine_starts_a_compiler_process_only_when_a_constraint_needs_one(tokenizer) -> None:
    """Each compiler process loads xgrammar (torch and transformers: seconds of CPU, hundreds of MB): an engine never
    asked for a constraint runs none, the first constraint starts one, and the next reuses it."""
    engine = EmbeddedEngine(EmbeddedEngineConfig(threads=1, max_running=1, max_model_len=128, grammar_workers=2))
    await engine.start(lambda: 0)
    try:
        assert engine._loaded is not None
        grammars = engine._loaded.grammars
        assert not grammars.process_ids()
        result = await generate(engine, chat(tokenizer, "Pick a number."), StructuredOutput("regex", "[1-6]{2}"),
                                seed=1)
        assert re.fullmatch("[1-6]{2}", tokenizer.decode(result.tokens[:-1]))
        started = grammars.process_ids()
        assert len(started) == 1  # one constraint at a time needs one of the two
        await generate(engine, chat(tokenizer, "Pick a number."), StructuredOutput("regex", "[2-5]{2}"), seed=1)
        assert grammars.process_ids() == started  # the idle one compiles the next: no second process loads
    finally:
        await engine.shutdown()
