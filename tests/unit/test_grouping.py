"""TokenGrouper: what the servicer sends for each engine chunk under StreamOptions."""

from __future__ import annotations

from agentloop_grpc.engine_adapters.grouping import TokenGrouper
from agentloop_grpc.common.types import TokenChunk


def chunk(*tokens: int, version: int = 0) -> TokenChunk:
    return TokenChunk(tuple(tokens), version, tuple(-0.1 * t for t in tokens), tuple(((t, -0.1 * t),) for t in tokens))


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
