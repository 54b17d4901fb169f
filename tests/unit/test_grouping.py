"""merge_chunks and TokenGrouper: what the servicer sends for each engine chunk under StreamOptions."""

from __future__ import annotations

from agentloop_grpc.common.types import TokenChunk
from agentloop_grpc.engine_adapters.grouping import TokenGrouper, merge_chunks


def chunk(*tokens: int, version: int = 0) -> TokenChunk:
    return TokenChunk(tuple(tokens), version, tuple(-0.1 * t for t in tokens), tuple(((t, -0.1 * t),) for t in tokens))


def test_merge_chunks_keeps_every_token_logprob_and_alternative_in_order() -> None:
    assert merge_chunks([]) == []
    single = chunk(7)
    assert merge_chunks([single])[0] is single
    assert merge_chunks([chunk(1), chunk(2, 3), chunk(4)]) == [chunk(1, 2, 3, 4)]


def test_merge_chunks_never_merges_across_a_weight_version_change() -> None:
    chunks = [chunk(1, version=0), chunk(2, version=0), chunk(3, version=1), chunk(4, 5, version=1)]
    chunks.append(chunk(6, version=0))
    merged = merge_chunks(chunks)
    assert merged == [chunk(1, 2, version=0), chunk(3, 4, 5, version=1), chunk(6, version=0)]
    assert merged[-1] is chunks[-1]  # a run of one chunk is passed on as it is


def test_merge_chunks_without_logprobs() -> None:
    plain = [TokenChunk((1,), 3), TokenChunk((2, 3), 3)]
    assert merge_chunks(plain) == [TokenChunk((1, 2, 3), 3)]


def test_min_chunk_tokens_sends_once_enough_are_pending_and_keeps_the_rest_for_the_end() -> None:
    grouper = TokenGrouper(min_chunk_tokens=3, final_only=False)
    assert grouper.add(chunk(1)) == [] and grouper.add(chunk(2)) == []
    assert grouper.add(chunk(3, 4)) == [chunk(1, 2, 3, 4)]  # merged in order, with logprobs and alternatives
    assert grouper.add(chunk(5)) == []
    assert grouper.tail() == chunk(5) and grouper.tail() is None


def test_final_only_holds_everything_until_the_end() -> None:
    grouper = TokenGrouper(min_chunk_tokens=2, final_only=True)
    assert all(grouper.add(chunk(t)) == [] for t in range(10))
    assert grouper.tail() == chunk(*range(10))


def test_a_new_weight_version_sends_the_older_tokens_first() -> None:
    grouper = TokenGrouper(min_chunk_tokens=0, final_only=True)
    grouper.add(chunk(1, version=4))
    grouper.add(chunk(2, version=4))
    assert grouper.add(chunk(3, version=5)) == [chunk(1, 2, version=4)]
    assert grouper.tail() == chunk(3, version=5)


def test_a_version_change_and_a_full_group_in_one_step() -> None:
    grouper = TokenGrouper(min_chunk_tokens=2, final_only=False)
    grouper.add(chunk(1, version=0))
    assert grouper.add(chunk(2, 3, version=1)) == [chunk(1, version=0), chunk(2, 3, version=1)]
    assert grouper.tail() is None
