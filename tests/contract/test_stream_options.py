"""Contract: StreamOptions group tokens into fewer messages and change nothing else (tokens, logprobs, versions)."""

from __future__ import annotations

import asyncio

import pytest

from agentloop_grpc.v1 import generation_pb2

from .target import ContractTarget, StreamWatcher, collect, request

LENGTH = generation_pb2.FINISH_REASON_LENGTH
ABORT = generation_pb2.FINISH_REASON_ABORT


def _grouped(engine: ContractTarget, min_chunk_tokens: int = 0, final_only: bool = False, **sampling):
    req = request(engine, **sampling)
    req.stream_options.CopyFrom(generation_pb2.StreamOptions(min_chunk_tokens=min_chunk_tokens, final_only=final_only))
    return req


async def test_final_only_is_one_message_with_the_same_tokens_and_logprobs(engine: ContractTarget) -> None:
    sampling = {"max_new_tokens": 9, "ignore_eos": True, "temperature": 0, "top_logprobs": 2}
    streamed = await collect(engine, request(engine, **sampling))
    final = await collect(engine, _grouped(engine, final_only=True, **sampling))
    assert [m.WhichOneof("response") for m in final.messages] == ["complete"]
    tail = final.complete.tokens
    assert list(tail.token_ids) == streamed.tokens and len(streamed.tokens) == 9
    assert list(tail.logprobs) == pytest.approx(streamed.logprobs, abs=1e-3)
    assert len(tail.top_logprobs) == 9 and all(len(alt.token_ids) == 2 for alt in tail.top_logprobs)
    assert final.complete.completion_tokens == 9 and final.complete.finish_reason == LENGTH
    assert tail.weight_version == final.complete.weight_version == (await engine.info()).weight_version


async def test_min_chunk_tokens_groups_chunks_and_sends_the_rest_with_the_completion(engine: ContractTarget) -> None:
    sampling = {"max_new_tokens": 11, "ignore_eos": True, "temperature": 0}
    streamed = await collect(engine, request(engine, **sampling))
    grouped = await collect(engine, _grouped(engine, min_chunk_tokens=4, **sampling))
    assert grouped.chunks and all(len(c.token_ids) >= 4 for c in grouped.chunks)
    assert len(grouped.complete.tokens.token_ids) < 4  # what was still pending at the end
    assert grouped.tokens == streamed.tokens and grouped.complete.completion_tokens == 11


async def test_min_chunk_tokens_of_one_streams_every_token(engine: ContractTarget) -> None:
    grouped = await collect(engine, _grouped(engine, min_chunk_tokens=1, max_new_tokens=5, ignore_eos=True))
    assert not grouped.complete.HasField("tokens") and len(grouped.tokens) == 5


async def test_abort_returns_the_pending_tokens_with_the_completion(engine: ContractTarget) -> None:
    grouped = _grouped(engine, final_only=True, max_new_tokens=engine.long_tokens, ignore_eos=True)
    watcher = StreamWatcher(engine, grouped)
    await engine.wait_running()
    # A companion admitted after it streams a token only once a step has run both: then the first has decoded
    # tokens too, all of them pending (final_only). Waiting on a clock instead failed on a busy machine.
    companion = StreamWatcher(engine, request(engine, max_new_tokens=engine.long_tokens, ignore_eos=True))
    await companion.first_tokens()
    await engine.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
    await companion.result()
    result = await watcher.result()
    assert [m.WhichOneof("response") for m in result.messages] == ["complete"]
    assert result.complete.finish_reason == ABORT
    assert 0 < len(result.tokens) == result.complete.completion_tokens < engine.long_tokens


async def test_tokens_of_two_weight_versions_are_never_merged(engine: ContractTarget) -> None:
    """Pause(KEEP) -> UpdateWeights -> Resume during a final_only call: the old version's tokens come as a chunk."""
    before = (await engine.info()).weight_version
    sampling = {"max_new_tokens": engine.long_tokens // 2, "ignore_eos": True, "seed": 77}
    reference = await collect(engine, request(engine, **sampling))
    watcher = StreamWatcher(engine, _grouped(engine, final_only=True, **sampling))
    await engine.wait_running()
    await asyncio.sleep(0.5)  # long_tokens // 2 last about half a second or more: some are decoded, not all
    await engine.reload_same_weights()  # the tokens must not change
    result = await watcher.result()
    assert [m.WhichOneof("response") for m in result.messages] == ["chunk", "complete"]
    assert result.chunks[0].weight_version == before and result.chunks[0].token_ids
    assert result.complete.tokens.weight_version == result.complete.weight_version == before + 1
    assert result.tokens == reference.tokens
