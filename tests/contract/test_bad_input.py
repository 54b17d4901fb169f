"""Contract: every bad input gets its status code and a message naming the field, and loses nothing."""

from __future__ import annotations

import asyncio
import math
import struct

import grpc
import pytest

from agentloop_grpc.v1 import generation_pb2

from .target import ContractTarget, collect, generate_error, request

INVALID = grpc.StatusCode.INVALID_ARGUMENT
#: Levels of JSON arrays and objects, or of regex groups, a constraint may nest.
NESTING_BOUND = 64


def _nested(opening: str, closing: str, depth: int, inner: str = "") -> str:
    return opening * depth + inner + closing * depth


def _deep_schema(depth: int) -> str:
    """A valid JSON Schema whose objects nest ``depth`` levels deep (arrays of arrays ... of integers)."""
    return _nested('{"type": "array", "items": ', "}", depth - 1, '{"type": "integer"}')


def _with(target: ContractTarget, info, case: str) -> tuple[generation_pb2.GenerateRequest, str]:
    """Build the bad request of ``case``; return it with a text the error message must contain."""
    vocab, limit = info.vocab_size, info.max_model_len
    sampling = {
        "temperature_negative": ({"temperature": -0.5}, "temperature"),
        "temperature_nan": ({"temperature": math.nan}, "temperature"),
        "temperature_inf": ({"temperature": math.inf}, "temperature"),
        "top_p_zero": ({"top_p": 0.0}, "top_p"),
        "top_p_over_one": ({"top_p": 1.5}, "top_p"),
        "top_k_below_minus_one": ({"top_k": -2}, "top_k"),
        "min_p_over_one": ({"min_p": 1.5}, "min_p"),
        "repetition_penalty_zero": ({"repetition_penalty": 0.0}, "repetition_penalty"),
        "presence_penalty_big": ({"presence_penalty": 3.0}, "presence_penalty"),
        "max_new_tokens_zero": ({"max_new_tokens": 0}, "max_new_tokens"),
        "max_new_tokens_over_limit": ({"max_new_tokens": limit + 1}, "max_new_tokens"),
        "prompt_plus_budget_over_limit": (
            {"max_new_tokens": limit - len(target.prompt) + 1},
            "max_model_len",
        ),
        "stop_id_out_of_vocab": ({"stop_token_ids": [vocab]}, "stop_token_ids"),
        "top_logprobs_too_many": ({"top_logprobs": 21}, "top_logprobs"),
    }
    if case in sampling:
        fields, needle = sampling[case]
        return request(target, **fields), needle
    prompts = {
        "empty_prompt": ([], "prompt_ids"),
        "negative_id": ([1, -1, 2], "prompt_ids[1]"),
        "id_equal_to_vocab": ([1, vocab], "prompt_ids[1]"),
        "prompt_fills_context": ([1] * limit, "max_model_len"),
    }
    if case in prompts:
        prompt, needle = prompts[case]
        return request(target, prompt=prompt, max_new_tokens=1), needle
    structured = {
        "json_schema_not_json": (generation_pb2.StructuredOutput(json_schema="{not json"), "json_schema"),
        "json_schema_not_object": (generation_pb2.StructuredOutput(json_schema="[1, 2]"), "json_schema"),
        "regex_broken": (generation_pb2.StructuredOutput(regex="(unclosed"), "regex"),
        "grammar_empty": (generation_pb2.StructuredOutput(ebnf_grammar="  "), "ebnf_grammar"),
        "grammar_without_root": (generation_pb2.StructuredOutput(ebnf_grammar='item ::= "a"'), "root"),
        "structured_without_kind": (generation_pb2.StructuredOutput(), "structured_output"),
        # Python's recursion and int-digit limits escaped the validators as INTERNAL at these depths and lengths
        "json_schema_nested_5000": (generation_pb2.StructuredOutput(json_schema=_nested("[", "]", 5000)), "nested"),
        "json_schema_nested_30000": (generation_pb2.StructuredOutput(json_schema=_nested("[", "]", 30_000)), "nested"),
        "json_schema_nested_100000": (
            generation_pb2.StructuredOutput(json_schema=_nested("[", "]", 100_000)),
            "structured_output.json_schema",
        ),
        "json_schema_long_integer": (
            generation_pb2.StructuredOutput(json_schema='{"type": "integer", "maximum": ' + "9" * 5000 + "}"),
            "number",
        ),
        "regex_nested_5000": (generation_pb2.StructuredOutput(regex=_nested("(", ")", 5000, "a")), "nested"),
        "regex_nested_30000": (generation_pb2.StructuredOutput(regex=_nested("(", ")", 30_000, "a")), "nested"),
        # valid constraints just past the nesting bound, which an engine would compile (slowly, deeper still)
        "json_schema_nested_past_bound": (
            generation_pb2.StructuredOutput(json_schema=_deep_schema(NESTING_BOUND + 1)),
            "nested more than 64",
        ),
        "regex_nested_past_bound": (
            generation_pb2.StructuredOutput(regex=_nested("(", ")", NESTING_BOUND + 1, "a")),
            "nested more than 64",
        ),
    }
    raw = {
        "raw_and_repeated_prompt": (bytes(4), "prompt_ids or prompt_ids_raw, not both"),
        "raw_prompt_not_whole_ids": (bytes(6), "prompt_ids_raw has 6 bytes"),
        "raw_negative_id": (struct.pack("<3i", 1, -1, 2), "prompt_ids_raw[1]"),
        "raw_id_equal_to_vocab": (struct.pack("<2i", 1, vocab), "prompt_ids_raw[1]"),
    }
    if case in raw:
        data, needle = raw[case]
        req = request(target, prompt=target.prompt if case == "raw_and_repeated_prompt" else [], max_new_tokens=1)
        req.prompt_ids_raw = data
        return req, needle
    if case == "min_chunk_tokens_negative":
        req = request(target, max_new_tokens=4)
        req.stream_options.min_chunk_tokens = -1
        return req, "stream_options.min_chunk_tokens"
    spec, needle = structured[case]
    req = request(target, max_new_tokens=4)
    req.structured_output.CopyFrom(spec)
    return req, needle


CASES = [
    "empty_prompt",
    "negative_id",
    "id_equal_to_vocab",
    "prompt_fills_context",
    "raw_and_repeated_prompt",
    "raw_prompt_not_whole_ids",
    "raw_negative_id",
    "raw_id_equal_to_vocab",
    "temperature_negative",
    "temperature_nan",
    "temperature_inf",
    "top_p_zero",
    "top_p_over_one",
    "top_k_below_minus_one",
    "min_p_over_one",
    "repetition_penalty_zero",
    "presence_penalty_big",
    "max_new_tokens_zero",
    "max_new_tokens_over_limit",
    "prompt_plus_budget_over_limit",
    "stop_id_out_of_vocab",
    "top_logprobs_too_many",
    "json_schema_not_json",
    "json_schema_not_object",
    "regex_broken",
    "grammar_empty",
    "grammar_without_root",
    "structured_without_kind",
    "json_schema_nested_5000",
    "json_schema_nested_30000",
    "json_schema_nested_100000",
    "json_schema_long_integer",
    "regex_nested_5000",
    "regex_nested_30000",
    "json_schema_nested_past_bound",
    "regex_nested_past_bound",
    "min_chunk_tokens_negative",
]


@pytest.mark.fault
@pytest.mark.parametrize("case", CASES)
async def test_bad_input_is_invalid_argument_naming_the_field(engine: ContractTarget, case: str) -> None:
    info = await engine.info()
    bad, needle = _with(engine, info, case)
    error = await generate_error(engine, bad)
    assert error.code() == INVALID, error.details()
    assert needle in error.details()
    # the server stays healthy: a good request right after succeeds, nothing is left in flight
    good = await collect(engine, request(engine, max_new_tokens=2, ignore_eos=True))
    assert len(good.tokens) == 2
    assert (await engine.wait_no_requests()).running_requests == 0


async def test_missing_request_id_is_invalid(engine: ContractTarget) -> None:
    error = await generate_error(engine, request(engine, request_id="", max_new_tokens=2))
    assert error.code() == INVALID and "request_id" in error.details()


@pytest.mark.fault
async def test_duplicate_request_id_in_flight_is_refused_and_first_goes_on(engine: ContractTarget) -> None:
    first = request(engine, max_new_tokens=engine.long_tokens // 10, ignore_eos=True)
    running = asyncio.create_task(collect(engine, first))
    while (await engine.load()).running_requests == 0:
        await asyncio.sleep(0.01)
    error = await generate_error(engine, request(engine, request_id=first.request_id, max_new_tokens=2))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert first.request_id in error.details()
    result = await running
    assert result.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert len(result.tokens) == engine.long_tokens // 10
    # once finished, the id may be used again
    again = await collect(engine, request(engine, request_id=first.request_id, max_new_tokens=2, ignore_eos=True))
    assert len(again.tokens) == 2


async def test_bad_input_does_not_disturb_other_streams(engine: ContractTarget) -> None:
    running = asyncio.create_task(
        collect(engine, request(engine, max_new_tokens=engine.long_tokens // 10, ignore_eos=True, seed=5))
    )
    errors = await asyncio.gather(
        *(generate_error(engine, request(engine, prompt=[], max_new_tokens=1)) for _ in range(20))
    )
    assert {e.code() for e in errors} == {INVALID}
    result = await running
    assert len(result.tokens) == engine.long_tokens // 10


# -- size bounds: ids and constraints are bounded in bytes, and error messages quote a bounded prefix ----------

ID_BOUND = 256
SPEC_BOUND = 64 * 1024
#: What an error message may carry at most (gRPC's metadata limit is 8 KiB; a message quoting an input whole broke
#: it, and the client saw RESOURCE_EXHAUSTED instead of the server's status).
DETAILS_BOUND = 1024


def _overlong_id(name: str) -> str:
    return f"{name}-" + "x" * 100_000


@pytest.mark.fault
@pytest.mark.parametrize("field", ["request_id", "session_id"])
async def test_an_id_over_its_bound_is_invalid_and_quoted_by_a_prefix(engine: ContractTarget, field: str) -> None:
    req = request(engine, max_new_tokens=2)
    setattr(req, field, _overlong_id(field))
    error = await generate_error(engine, req)
    assert error.code() == INVALID, error.details()
    assert field in error.details() and f"at most {ID_BOUND} bytes" in error.details()
    assert len(error.details().encode()) <= DETAILS_BOUND
    assert (await engine.wait_no_requests()).running_requests == 0


@pytest.mark.fault
async def test_an_id_bound_counts_utf8_bytes(engine: ContractTarget) -> None:
    at_bound = await collect(engine, request(engine, request_id="é" * (ID_BOUND // 2), max_new_tokens=2))
    assert at_bound.complete.completion_tokens == 2
    error = await generate_error(engine, request(engine, request_id="é" * (ID_BOUND // 2 + 1), max_new_tokens=2))
    assert error.code() == INVALID and f"has {ID_BOUND + 2} bytes" in error.details()


@pytest.mark.fault
async def test_a_duplicate_of_an_overlong_id_is_invalid_not_resource_exhausted(engine: ContractTarget) -> None:
    """Echoed whole, the duplicate's 100 KB id overflowed the status metadata: the client read RESOURCE_EXHAUSTED,
    which routers retry."""
    first = request(engine, request_id=_overlong_id("dup"), max_new_tokens=engine.long_tokens // 10, ignore_eos=True)
    running = asyncio.create_task(collect(engine, first))
    await asyncio.sleep(0.2)
    error = await generate_error(engine, request(engine, request_id=first.request_id, max_new_tokens=2))
    assert error.code() == INVALID, error.details()
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the first was refused too: it never ran
        await running
    assert refused.value.code() == INVALID


@pytest.mark.fault
async def test_a_duplicate_at_the_id_bound_is_already_exists(engine: ContractTarget) -> None:
    first = request(engine, request_id="d" * ID_BOUND, max_new_tokens=engine.long_tokens // 10, ignore_eos=True)
    running = asyncio.create_task(collect(engine, first))
    await engine.wait_running()
    error = await generate_error(engine, request(engine, request_id=first.request_id, max_new_tokens=2))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "d" * 32 in error.details() and len(error.details().encode()) <= DETAILS_BOUND
    assert len((await running).tokens) == engine.long_tokens // 10


@pytest.mark.fault
async def test_abort_refuses_an_id_over_the_bound(engine: ContractTarget) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.generate.Abort(generation_pb2.AbortRequest(request_ids=["ok", _overlong_id("abort")]), timeout=10)
    assert error.value.code() == INVALID
    assert "request_ids[1]" in error.value.details() and len(error.value.details().encode()) <= DETAILS_BOUND


@pytest.mark.fault
@pytest.mark.parametrize("kind", ["json_schema", "regex", "ebnf_grammar"])
async def test_a_constraint_over_its_bound_is_invalid(engine: ContractTarget, kind: str) -> None:
    # valid in its language, so only the size is wrong: a JSON object, a regex and a grammar padded with blanks
    pad = " " * SPEC_BOUND
    spec = {"json_schema": "{}" + pad, "regex": "a" + "b?" * (SPEC_BOUND // 2), "ebnf_grammar": 'root ::= "a"' + pad}
    req = request(engine, max_new_tokens=2)
    setattr(req.structured_output, kind, spec[kind])
    error = await generate_error(engine, req)
    assert error.code() == INVALID, error.details()
    assert f"structured_output.{kind}" in error.details() and f"at most {SPEC_BOUND} bytes" in error.details()
    assert len(error.details().encode()) <= DETAILS_BOUND


@pytest.mark.fault
@pytest.mark.parametrize("kind", ["json_schema", "regex"])
async def test_a_constraint_at_its_nesting_bound_is_accepted(engine: ContractTarget, kind: str) -> None:
    spec = {"json_schema": _deep_schema(NESTING_BOUND), "regex": _nested("(", ")", NESTING_BOUND, "a")}
    req = request(engine, max_new_tokens=2)
    setattr(req.structured_output, kind, spec[kind])
    if not (await engine.info()).supports_structured_output:
        assert (await generate_error(engine, req)).code() == grpc.StatusCode.UNIMPLEMENTED
        return
    assert (await collect(engine, req)).complete.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED
