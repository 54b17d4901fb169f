"""Contract: the Generate stream, sampling controls, logprobs, abort and cancellation."""

from __future__ import annotations

import asyncio
import struct

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .target import ContractTarget, collect, read_rest, request

STOP = generation_pb2.FINISH_REASON_STOP
LENGTH = generation_pb2.FINISH_REASON_LENGTH
ABORT = generation_pb2.FINISH_REASON_ABORT


async def test_stream_is_chunks_then_exactly_one_complete(engine: ContractTarget) -> None:
    info = await engine.info()
    result = await collect(engine, request(engine, max_new_tokens=12, ignore_eos=True, temperature=0))
    kinds = [m.WhichOneof("response") for m in result.messages]
    assert kinds[-1] == "complete" and kinds.count("complete") == 1
    assert set(kinds[:-1]) == {"chunk"}
    complete = result.complete
    assert complete.finish_reason == LENGTH
    assert complete.completion_tokens == len(result.tokens) == 12
    assert complete.prompt_tokens == len(engine.prompt)
    assert complete.weight_version == info.weight_version
    assert all(0 <= t < info.vocab_size for t in result.tokens)
    assert not complete.HasField("matched_stop_token_id")


async def test_logprobs_align_with_tokens(engine: ContractTarget) -> None:
    result = await collect(engine, request(engine, max_new_tokens=10, ignore_eos=True, logprobs=True, seed=3))
    for chunk in result.chunks:
        assert len(chunk.logprobs) == len(chunk.token_ids)
        assert not chunk.top_logprobs
    assert len(result.logprobs) == len(result.tokens) == 10
    assert all(lp <= 0.0 for lp in result.logprobs)


async def test_top_logprobs_per_position(engine: ContractTarget) -> None:
    result = await collect(engine, request(engine, max_new_tokens=6, ignore_eos=True, top_logprobs=3, seed=3))
    for chunk in result.chunks:
        assert len(chunk.logprobs) == len(chunk.token_ids)  # top_logprobs implies logprobs
        assert len(chunk.top_logprobs) == len(chunk.token_ids)
        for alternatives in chunk.top_logprobs:
            assert len(alternatives.token_ids) == len(alternatives.logprobs) == 3
            assert list(alternatives.logprobs) == sorted(alternatives.logprobs, reverse=True)


async def test_no_logprobs_unless_asked(engine: ContractTarget) -> None:
    result = await collect(engine, request(engine, max_new_tokens=5, ignore_eos=True))
    assert result.logprobs == [] and all(not c.top_logprobs for c in result.chunks)


@pytest.mark.parametrize("budget", [1, 7])
async def test_max_new_tokens_is_exact(engine: ContractTarget, budget: int) -> None:
    result = await collect(engine, request(engine, max_new_tokens=budget, ignore_eos=True, seed=1))
    assert len(result.tokens) == budget and result.complete.finish_reason == LENGTH


async def test_stop_token_ends_generation_and_is_reported(engine: ContractTarget) -> None:
    reference = await collect(engine, request(engine, max_new_tokens=24, ignore_eos=True, temperature=0))
    stop_id = reference.tokens[5]
    first = reference.tokens.index(stop_id)
    result = await collect(
        engine, request(engine, max_new_tokens=24, ignore_eos=True, temperature=0, stop_token_ids=[stop_id])
    )
    assert result.tokens == reference.tokens[: first + 1]
    assert result.complete.finish_reason == STOP
    assert result.complete.matched_stop_token_id == stop_id


async def test_greedy_is_deterministic(engine: ContractTarget) -> None:
    a = await collect(engine, request(engine, max_new_tokens=16, ignore_eos=True, temperature=0, logprobs=True))
    b = await collect(engine, request(engine, max_new_tokens=16, ignore_eos=True, temperature=0, logprobs=True))
    assert a.tokens == b.tokens
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_raw_prompt_is_the_same_prompt(engine: ContractTarget) -> None:
    """prompt_ids_raw (little-endian int32) is the repeated prompt_ids in another form: same tokens, logprobs."""
    repeated = request(engine, max_new_tokens=8, ignore_eos=True, temperature=0, logprobs=True)
    raw = request(engine, prompt=[], max_new_tokens=8, ignore_eos=True, temperature=0, logprobs=True)
    raw.prompt_ids_raw = struct.pack(f"<{len(engine.prompt)}i", *engine.prompt)
    a, b = await collect(engine, repeated), await collect(engine, raw)
    assert b.tokens == a.tokens and len(b.tokens) == 8
    assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert b.complete.prompt_tokens == len(engine.prompt)


async def test_seed_reproduces_regardless_of_batch(engine: ContractTarget) -> None:
    def seeded(seed: int):
        return request(engine, max_new_tokens=16, ignore_eos=True, temperature=1.0, seed=seed, logprobs=True)

    alone = await collect(engine, seeded(1234))
    noise = [
        request(engine, prompt=[20 + i, 21 + i, 22 + i], max_new_tokens=30, ignore_eos=True, temperature=1.0)
        for i in range(4)
    ]
    batched, *_ = await asyncio.gather(collect(engine, seeded(1234)), *(collect(engine, r) for r in noise))
    other_seed = await collect(engine, seeded(99))
    assert batched.tokens == alone.tokens
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert other_seed.tokens != alone.tokens


async def test_abort_mid_stream_ends_with_abort_and_frees_engine(engine: ContractTarget) -> None:
    req = request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True)
    call = engine.generate.Generate(req, timeout=120)
    first = await call.read()
    assert isinstance(first, generation_pb2.GenerateResponse) and first.WhichOneof("response") == "chunk"
    messages = [first]
    aborted = await engine.generate.Abort(generation_pb2.AbortRequest(request_ids=[req.request_id]), timeout=10)
    assert list(aborted.aborted_request_ids) == [req.request_id]
    messages += await read_rest(call)
    assert messages[-1].complete.finish_reason == ABORT
    tokens = sum(len(m.chunk.token_ids) for m in messages[:-1])
    assert 0 < tokens < engine.long_tokens
    assert messages[-1].complete.completion_tokens == tokens
    load = await engine.wait_no_requests()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_abort_all_and_unknown_ids(engine: ContractTarget) -> None:
    reqs = [request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True) for _ in range(3)]
    calls = [engine.generate.Generate(r, timeout=120) for r in reqs]
    for call in calls:
        await call.read()
    unknown = await engine.generate.Abort(generation_pb2.AbortRequest(request_ids=["no-such-request"]), timeout=10)
    assert list(unknown.aborted_request_ids) == []
    aborted = await engine.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
    assert sorted(aborted.aborted_request_ids) == sorted(r.request_id for r in reqs)
    for call in calls:
        rest = await read_rest(call)
        assert rest[-1].complete.finish_reason == ABORT
    again = await engine.generate.Abort(generation_pb2.AbortRequest(request_ids=[reqs[0].request_id]), timeout=10)
    assert list(again.aborted_request_ids) == []  # idempotent


async def test_abort_needs_ids_or_all(engine: ContractTarget) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.generate.Abort(generation_pb2.AbortRequest(), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_client_cancel_aborts_in_engine(engine: ContractTarget) -> None:
    call = engine.generate.Generate(request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True), timeout=120)
    await call.read()
    assert (await engine.load()).running_requests == 1
    call.cancel()
    load = await engine.wait_no_requests()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_deadline_aborts_in_engine(engine: ContractTarget) -> None:
    call = engine.generate.Generate(request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True), timeout=0.5)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in call:
            pass
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    load = await engine.wait_no_requests()
    assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_256_concurrent_streams_complete(engine: ContractTarget) -> None:
    # one token each (sampled from the prefill): the streams' concurrency is the point (other tests stream many
    # tokens), and on the embedded engine every further token costs all 256 a decode step in batches of max_running
    reqs = [
        request(engine, prompt=[30 + i % 50, 31, 32, 33], max_new_tokens=1, ignore_eos=True, seed=i, logprobs=True)
        for i in range(256)
    ]
    results = await asyncio.gather(*(collect(engine, r, deadline_s=300) for r in reqs))
    for result in results:
        assert result.complete.finish_reason == LENGTH
        assert len(result.tokens) == len(result.logprobs) == 1
    assert (await engine.wait_no_requests()).running_requests == 0


async def test_get_load_reports_running_requests(engine: ContractTarget) -> None:
    calls = [
        engine.generate.Generate(request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
        for _ in range(2)
    ]
    for call in calls:
        await call.read()
    load = await engine.load()
    assert load.running_requests + load.waiting_requests == 2
    assert load.max_running_requests >= 1
    assert 0.0 <= load.kv_cache_usage <= 1.0 and 0.0 <= load.prefix_cache_hit_rate <= 1.0
    for call in calls:
        call.cancel()


async def test_every_completion_carries_the_load_get_load_reports(engine: ContractTarget) -> None:
    """A router that hears a completion needs no GetLoad poll: the completion says what GetLoad would, the
    finished request no longer counted."""
    busy = engine.generate.Generate(request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
    await busy.read()
    streamed = (await collect(engine, request(engine, max_new_tokens=2, ignore_eos=True))).complete
    unary = (await engine.generate.GenerateUnary(
        generation_pb2.GenerateUnaryRequest(request=request(engine, max_new_tokens=2, ignore_eos=True)), timeout=120
    )).complete
    polled = await engine.load()
    for complete in (streamed, unary):
        assert complete.HasField("load")
        load = complete.load
        assert load.running_requests + load.waiting_requests == 1  # the busy request, not the one that finished
        assert load.max_running_requests == polled.max_running_requests
        assert 0.0 <= load.kv_cache_usage <= 1.0 and 0.0 <= load.prefix_cache_hit_rate <= 1.0
    busy.cancel()


async def test_prefix_reuse_is_reported(engine: ContractTarget) -> None:
    await engine.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    prompt = [(7 * i) % 1000 + 3 for i in range(200)]
    first = await collect(engine, request(engine, prompt=prompt, max_new_tokens=4, ignore_eos=True, temperature=0))
    extended = prompt + first.tokens + [5, 6, 7]
    second = await collect(engine, request(engine, prompt=extended, max_new_tokens=4, ignore_eos=True, temperature=0))
    assert first.complete.cached_prompt_tokens == 0
    assert 0 < second.complete.cached_prompt_tokens < len(extended)
    assert (await engine.load()).prefix_cache_hit_rate > 0
