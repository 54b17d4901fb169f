"""SamplingCache: the same params resolve to the same SamplingParams; the budget is checked on every request."""

from __future__ import annotations

import pytest

from agentloop_grpc.engine_adapters.convert import sampling_from_proto
from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.engine_adapters.fake import FakeEngine, FakeEngineConfig
from agentloop_grpc.engine_adapters.sampling_cache import SamplingCache
from agentloop_grpc.v1 import generation_pb2

INFO = FakeEngine(FakeEngineConfig(max_model_len=100)).info()


def _params(**fields) -> generation_pb2.SamplingParams:
    return generation_pb2.SamplingParams(**fields)


def test_the_same_params_resolve_once_and_equal_an_uncached_resolution() -> None:
    cache = SamplingCache()
    params = _params(max_new_tokens=8, temperature=0.7, top_p=0.9, stop_token_ids=[5], logprobs=True)
    first = cache.resolve(params, 10, INFO)
    assert cache.resolve(_params(max_new_tokens=8, temperature=0.7, top_p=0.9, stop_token_ids=[5], logprobs=True),
                         10, INFO) is first
    assert first == sampling_from_proto(params, 10, INFO)
    assert cache.resolve(_params(max_new_tokens=8, temperature=0.7, top_p=0.9, seed=3), 10, INFO).seed == 3
    assert len(cache) == 2


def test_an_unset_budget_is_the_room_left_for_each_prompt() -> None:
    cache = SamplingCache()
    assert cache.resolve(_params(), 10, INFO).max_new_tokens == 90
    assert cache.resolve(_params(), 40, INFO).max_new_tokens == 60


def test_the_budget_is_checked_against_every_prompt_even_when_the_params_were_seen() -> None:
    cache = SamplingCache()
    cache.resolve(_params(max_new_tokens=50), 10, INFO)
    with pytest.raises(InvalidRequestError, match="max_new_tokens = 50"):
        cache.resolve(_params(max_new_tokens=50), 60, INFO)


def test_invalid_params_raise_every_time_and_are_not_stored() -> None:
    cache = SamplingCache()
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match="temperature"):
            cache.resolve(_params(max_new_tokens=4, temperature=-1.0), 10, INFO)
    assert len(cache) == 0


def test_the_cache_is_bounded() -> None:
    cache = SamplingCache(max_entries=3)
    for seed in range(10):
        assert cache.resolve(_params(max_new_tokens=4, seed=seed), 10, INFO).seed == seed
        assert len(cache) <= 3
