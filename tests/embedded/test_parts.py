"""The engine's parts on synthetic tensors (no model): prefix-cache keys and LRU, slot moves, sampling rules."""

from __future__ import annotations

import math

import psutil
import pytest
import torch

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.embedded.images import ImageFeatures
from agentloop_grpc.engine_adapters.embedded.kv_cache import KVShape, SlotKVCache
from agentloop_grpc.engine_adapters.embedded.prefix_cache import PrefixCache
from agentloop_grpc.engine_adapters.embedded.sampling import RequestSampler


def _kv(value: float, block: int = 4) -> torch.Tensor:
    return torch.full((2, 2, 1, block, 3), value)


def _fill(cache: PrefixCache, tokens: list[int]) -> None:
    blocks = cache.chain(tokens)
    for index in cache.missing(blocks, len(tokens)):
        cache.insert(blocks, index, _kv(float(index * cache.block_size)))


def _lookup(cache: PrefixCache, prompt: list[int]) -> list[torch.Tensor]:
    return cache.lookup(cache.chain(prompt), len(prompt))


def test_prefix_cache_serves_whole_blocks_of_the_prompt_but_its_last_token() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=64)
    _fill(cache, list(range(12)))
    assert len(cache) == 3
    assert [b[0, 0, 0, 0, 0].item() for b in _lookup(cache, list(range(12)))] == [0.0, 4.0]  # 12th token computed
    assert len(_lookup(cache, list(range(13)))) == 3
    assert len(_lookup(cache, [0, 1, 2, 3, 9, 9, 9, 9, 9])) == 1  # diverges in the second block
    assert _lookup(cache, [5, 1, 2, 3, 4]) == []  # a block's key covers everything before it
    assert cache.missing(cache.chain(list(range(12))), 12) == []
    assert cache.prompt_keys(cache.chain(list(range(13))), 13) == cache.chain(list(range(12))).keys


def test_prefix_cache_stores_a_sequence_as_it_grows_and_only_computed_blocks() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=64)
    blocks = cache.chain(list(range(10)))  # a prompt: 2 full blocks
    assert cache.missing(blocks, 6) == [0]  # prefill stopped after 6 tokens: one block's KV exists
    blocks.extend([10, 11, 12])  # its output
    assert cache.missing(blocks, 13) == [0, 1, 2] and blocks.keys == cache.chain(list(range(13))).keys


def test_prefix_cache_never_serves_a_block_whose_ids_or_parent_differ() -> None:
    """A key that collides (forced here) still misses: a lookup compares the entry's ids and parent key."""
    cache = PrefixCache(block_size=4, capacity_tokens=64)
    _fill(cache, list(range(8)))
    _fill(cache, [5, 5, 5, 5, 4, 5, 6, 7])
    other = cache.chain([9] * 9)
    other.keys[:] = cache.chain(list(range(8))).keys  # other ids under cached keys
    assert cache.lookup(other, 9) == []
    other = cache.chain(list(range(9)))
    other.keys[1] = cache.chain([5, 5, 5, 5, 4, 5, 6, 7]).keys[1]  # the same ids as a cached block, its key...
    assert len(cache.lookup(other, 9)) == 1  # ... but another parent


def test_prefix_cache_evicts_least_recently_used_blocks() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=16)
    _fill(cache, [1] * 8)
    _fill(cache, [2] * 8)
    assert len(_lookup(cache, [1] * 9)) == 2
    _fill(cache, [3] * 8)  # evicts the [2] blocks, used least recently
    assert len(cache) == 4
    assert _lookup(cache, [2] * 9) == [] and len(_lookup(cache, [1] * 9)) == 2
    cache.record(prompt_tokens=10, cached_tokens=4)
    assert cache.hit_rate == pytest.approx(0.4)
    cache.clear()
    assert len(cache) == 0 and cache.hit_rate == 0.0


def test_after_a_weight_update_old_blocks_are_never_served_and_leave_first() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=24)  # 6 blocks
    _fill(cache, [1] * 8)
    hashed_before = cache.chain([1] * 9)  # a request that waited across the update
    cache.advance()
    assert (len(cache), cache.stale_blocks) == (2, 2)
    assert _lookup(cache, [1] * 9) == []  # hashed after the update: other keys
    assert cache.lookup(hashed_before, 9) == []  # the old keys: their blocks are stale, never served
    _fill(cache, [2] * 8)
    cache.note_session("ended", cache.chain([2] * 8), 8)
    assert cache.end_sessions(["ended"]) == 2
    _fill(cache, [3] * 12)  # 7 blocks: one goes, a stale one, though the ended session's were demoted
    assert cache.stale_blocks == 1
    _fill(cache, [4] * 8)  # 8 blocks: the last stale one, then the ended session's tail
    assert cache.stale_blocks == 0
    assert [len(_lookup(cache, [t] * 13)) for t in (2, 3, 4)] == [1, 3, 2]
    cache.advance()
    cache.clear()  # FlushCache drops the stale blocks too
    assert len(cache) == 0


def test_ended_sessions_blocks_leave_first_unless_a_live_session_holds_them() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=24)  # 6 blocks
    for session, token in (("live", 1), ("ended", 2)):
        _fill(cache, [token] * 8)
        cache.note_session(session, cache.chain([token] * 8), 8)
    cache.note_session("sibling", cache.chain([1] * 8), 8)  # the same prompt as "live"
    assert cache.end_sessions(["sibling", "unknown"]) == 0  # "live" still holds them
    assert cache.end_sessions(["ended"]) == 2
    _fill(cache, [3] * 12)  # 7 blocks: the ended session's tail goes, not the older "live" blocks
    assert [len(_lookup(cache, [t] * 13)) for t in (1, 2, 3)] == [2, 1, 3]
    assert len(cache.sessions) == 1  # "live" (its blocks evicted would forget it too)
    _fill(cache, [4] * 24)  # evicts everything else
    assert len(cache.sessions) == 0


def test_prefix_cache_keys_and_compares_blocks_by_their_images() -> None:
    """Same ids, another picture: no block from the first one that overlaps the image; the same picture: all."""
    cache = PrefixCache(block_size=4, capacity_tokens=64)
    ids = list(range(16))
    red, blue = MediaInput("image/png", b"red", 5, 6), MediaInput("image/png", b"blue", 5, 6)  # span [5, 11)
    blocks = cache.chain(ids, (red,))
    for index in cache.missing(blocks, 16):
        cache.insert(blocks, index, _kv(float(index)))
    assert len(cache.lookup(cache.chain(ids + [0], (blue,)), 17)) == 1  # block 1 holds the image's first ids
    assert len(cache.lookup(cache.chain(ids + [0], (red,)), 17)) == 4
    assert len(cache.lookup(cache.chain(ids + [0]), 17)) == 1  # the same ids without the picture
    colliding = cache.chain(ids + [0], (blue,))
    colliding.keys[:] = cache.chain(ids + [0], (red,)).keys  # the red keys, but the blue picture's digests
    assert len(cache.lookup(colliding, 17)) == 1  # a lookup compares the pictures too


def test_image_features_are_cut_by_prefill_chunk() -> None:
    features = ImageFeatures(torch.tensor([3, 4, 5, 9]), torch.arange(8.0).reshape(4, 2))
    assert features.within(0, 3) is None
    cut = features.within(4, 10)
    assert cut is not None
    where, rows = cut
    assert where.tolist() == [0, 1, 5] and rows.tolist() == [[2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def test_disabled_prefix_cache_never_hits() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=0)
    blocks = cache.chain(list(range(12)))
    assert not cache.enabled and blocks.keys == []
    assert cache.missing(blocks, 12) == [] and cache.lookup(blocks, 12) == []


def test_slot_moves_and_block_copies() -> None:
    kv = SlotKVCache(KVShape(layers=2, slots=3, kv_heads=1, max_len=8, head_dim=2))
    assert not kv.allocated
    kv.allocate()
    kv.keys[0][2, :, :5] = 7.0
    kv.values[1][2, :, :5] = 9.0
    kv.move(2, 0, 5)
    assert torch.all(kv.keys[0][0, :, :5] == 7.0) and torch.all(kv.values[1][0, :, :5] == 9.0)
    assert torch.all(kv.keys[0][0, :, 5:] == 0.0)
    block = kv.read(0, 1, 3)
    assert block.shape == (2, 2, 1, 2, 2)
    kv.write(1, 4, block)
    assert torch.all(kv.keys[0][1, :, 4:6] == 7.0) and torch.all(kv.values[1][1, :, 4:6] == 9.0)
    kv.release()
    assert not kv.allocated


def _resident_bytes() -> int:
    return psutil.Process().memory_info().rss


def test_the_kv_budget_takes_memory_only_where_requests_write() -> None:
    """An allocated cache holds what its slots use: the default budget is ~5.8 GB, and a server that took it all at
    start (torch.zeros writes every page) held that much with no request (two replicas ~12.6 GB in a test)."""
    shape = KVShape(layers=4, slots=64, kv_heads=3, max_len=2048, head_dim=64)  # 800 MB of keys and values
    kv = SlotKVCache(shape)
    before = _resident_bytes()
    kv.allocate()
    untouched = _resident_bytes() - before
    kv.keys[3][5, :, :100] = 1.0
    assert untouched < 50e6, f"{untouched / 1e6:.0f} MB resident for an unused 800 MB cache"
    assert float(kv.keys[3].sum()) == 3 * 100 * 64 and float(kv.values[0].abs().sum()) == 0.0
    kv.release()


LOGITS = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])


def _sampler(**params) -> RequestSampler:
    params.setdefault("max_new_tokens", 4)
    return RequestSampler(SamplingParams(**params), prompt_ids=(0,), vocab_size=len(LOGITS))


def _support(**params) -> set[int]:
    sampler = _sampler(seed=0, **params)
    return {sampler.sample(LOGITS.clone(), None).token for _ in range(300)}


def test_truncation_rules_limit_the_support() -> None:
    assert _support(top_k=2) == {0, 1}
    probs = torch.softmax(LOGITS, dim=-1)
    assert _support(top_p=float(probs[0] + probs[1] / 2)) == {0, 1}  # the token that crosses top_p stays
    assert _support(min_p=float(probs[2] / probs[0]) - 1e-4) == {0, 1, 2}
    assert _support(temperature=0.0) == {0}


def test_logprob_is_under_the_distribution_sampled_from() -> None:
    sampled = _sampler(seed=1, top_k=2, temperature=0.5, logprobs=True, top_logprobs=3).sample(LOGITS.clone(), None)
    kept = torch.log_softmax(LOGITS[:2] / 0.5, dim=-1)
    assert sampled.logprob == pytest.approx(kept[sampled.token].item(), abs=1e-6)
    assert [t for t, _ in sampled.top[:2]] == [0, 1]
    assert sampled.top[2][1] == -math.inf  # only two tokens survive top_k: the third alternative is impossible


def test_seeded_stream_is_reproducible_and_masks_apply() -> None:
    def draw(seed: int) -> list[int]:
        sampler = _sampler(seed=seed)
        return [sampler.sample(LOGITS.clone(), None).token for _ in range(30)]

    assert draw(5) == draw(5) and draw(5) != draw(6)
    allowed = torch.tensor([False, False, False, True, True, False])
    assert _sampler(temperature=0.0).sample(LOGITS.clone(), allowed).token == 3


def test_penalties_follow_the_seen_tokens() -> None:
    sampler = _sampler(temperature=0.0, repetition_penalty=10.0)  # token 0 is in the prompt
    assert sampler.sample(LOGITS.clone(), None).token == 1
    sampler = _sampler(temperature=0.0, frequency_penalty=2.0)
    tokens = []
    for _ in range(3):
        tokens.append(sampler.sample(LOGITS.clone(), None).token)
        sampler.observe(tokens[-1])
    assert tokens == [0, 1, 0]  # 4-2 = 2 < 3 ; then 4-2 = 2 vs 3-2 = 1


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        EmbeddedEngineConfig(max_running=0)
    with pytest.raises(ValueError):
        EmbeddedEngineConfig(prefix_block_size=0)
