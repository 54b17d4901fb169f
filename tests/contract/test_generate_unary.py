"""Contract: GenerateUnary is Generate answered in one message: same tokens, logprobs, limits, errors and aborts."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .target import ContractTarget, collect, request
from .test_bad_input import _with

LENGTH = generation_pb2.FINISH_REASON_LENGTH
STOP = generation_pb2.FINISH_REASON_STOP
ABORT = generation_pb2.FINISH_REASON_ABORT
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _call(engine: ContractTarget, req: generation_pb2.GenerateRequest, timeout: float = 120):
    return engine.generate.GenerateUnary(generation_pb2.GenerateUnaryRequest(request=req), timeout=timeout)


def _tokens(response: generation_pb2.GenerateUnaryResponse) -> list[int]:
    return [t for c in response.chunks for t in c.token_ids] + list(response.complete.tokens.token_ids)


async def _unary_error(engine: ContractTarget, message: generation_pb2.GenerateUnaryRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.generate.GenerateUnary(message, timeout=30)
    return error.value



async def test_unary_answers_what_the_stream_streams(engine: ContractTarget) -> None:
    sampling = {"max_new_tokens": 9, "ignore_eos": True, "temperature": 0, "top_logprobs": 2}
    streamed = await collect(engine, request(engine, **sampling))
    response = await _call(engine, request(engine, **sampling))
    assert not response.chunks  # one weight version: every token travels in the completion
    tail = response.complete.tokens
    assert list(tail.token_ids) == streamed.tokens and len(streamed.tokens) == 9
    assert list(tail.logprobs) == pytest.approx(streamed.logprobs, abs=1e-3)
    assert len(tail.top_logprobs) == 9 and all(len(alt.token_ids) == 2 for alt in tail.top_logprobs)
    complete = response.complete
    assert (complete.finish_reason, complete.completion_tokens) == (LENGTH, 9)
    assert complete.prompt_tokens == len(engine.prompt)
    assert tail.weight_version == complete.weight_version == (await engine.info()).weight_version


async def test_unary_stop_token_ends_generation_and_is_reported(engine: ContractTarget) -> None:
    reference = await collect(engine, request(engine, max_new_tokens=24, ignore_eos=True, temperature=0))
    stop_id = reference.tokens[5]
    first = reference.tokens.index(stop_id)
    response = await _call(
        engine, request(engine, max_new_tokens=24, ignore_eos=True, temperature=0, stop_token_ids=[stop_id])
    )
    assert _tokens(response) == reference.tokens[: first + 1]
    assert response.complete.finish_reason == STOP and response.complete.matched_stop_token_id == stop_id


@pytest.mark.parametrize("case", ["negative_id", "empty_prompt", "temperature_nan", "max_new_tokens_over_limit"])
async def test_unary_bad_input_is_invalid_argument_naming_the_field(engine: ContractTarget, case: str) -> None:
    bad, needle = _with(engine, await engine.info(), case)
    error = await _unary_error(engine, generation_pb2.GenerateUnaryRequest(request=bad))
    assert error.code() == INVALID and needle in error.details(), error.details()
    good = await _call(engine, request(engine, max_new_tokens=2, ignore_eos=True))
    assert len(_tokens(good)) == 2
    assert (await engine.wait_no_requests()).running_requests == 0


async def test_unary_refuses_stream_options_and_a_missing_request(engine: ContractTarget) -> None:
    shaped = request(engine, max_new_tokens=2)
    shaped.stream_options.final_only = True
    error = await _unary_error(engine, generation_pb2.GenerateUnaryRequest(request=shaped))
    assert error.code() == INVALID and "stream_options" in error.details()
    error = await _unary_error(engine, generation_pb2.GenerateUnaryRequest())
    assert error.code() == INVALID and "request" in error.details()
    assert (await engine.wait_no_requests()).running_requests == 0


async def test_unary_shares_request_ids_with_streams(engine: ContractTarget) -> None:
    first = request(engine, max_new_tokens=engine.long_tokens // 10, ignore_eos=True)
    running = asyncio.create_task(collect(engine, first))
    await engine.wait_running()
    duplicate = request(engine, request_id=first.request_id, max_new_tokens=2)
    error = await _unary_error(engine, generation_pb2.GenerateUnaryRequest(request=duplicate))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS and first.request_id in error.details()
    assert len((await running).tokens) == engine.long_tokens // 10


async def test_unary_abort_answers_with_the_tokens_decoded_so_far(engine: ContractTarget) -> None:
    call = _call(engine, request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
    await engine.wait_running()
    await asyncio.sleep(0.5)  # let it decode some tokens
    await engine.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
    response = await call
    assert response.complete.finish_reason == ABORT
    assert 0 < len(_tokens(response)) == response.complete.completion_tokens < engine.long_tokens


async def test_unary_client_cancel_aborts_in_engine(engine: ContractTarget) -> None:
    call = _call(engine, request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
    await engine.wait_running()
    call.cancel()
    load = await engine.wait_no_requests()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_unary_deadline_aborts_in_engine(engine: ContractTarget) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _call(engine, request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True), timeout=0.5)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    load = await engine.wait_no_requests()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_unary_is_unavailable_while_asleep(engine: ContractTarget) -> None:
    await engine.control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE), timeout=60)
    error = await _unary_error(engine, generation_pb2.GenerateUnaryRequest(request=request(engine, max_new_tokens=2)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    await engine.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=60)
    assert len(_tokens(await _call(engine, request(engine, max_new_tokens=2, ignore_eos=True)))) == 2


async def test_unary_splits_tokens_where_the_weight_version_changes(engine: ContractTarget) -> None:
    """Pause(KEEP) -> UpdateWeights -> Resume during a call: the old version's tokens come as a chunk."""
    before = (await engine.info()).weight_version
    sampling = {"max_new_tokens": engine.long_tokens // 2, "ignore_eos": True, "seed": 78}
    reference = await collect(engine, request(engine, **sampling))
    call = _call(engine, request(engine, **sampling))
    await engine.wait_running()
    await asyncio.sleep(0.5)  # long_tokens // 2 last about half a second or more: some are decoded, not all
    await engine.reload_same_weights()  # the tokens must not change
    response = await call
    assert len(response.chunks) == 1 and response.chunks[0].token_ids
    assert response.chunks[0].weight_version == before
    assert response.complete.tokens.weight_version == response.complete.weight_version == before + 1
    assert _tokens(response) == reference.tokens
