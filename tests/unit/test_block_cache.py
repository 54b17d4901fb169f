"""The fake engine's block cache: longest cached prefix by binary search, prefix closure under eviction, LRU."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentloop_grpc.engine_adapters.block_cache import BlockCache


def _chain(name: int, length: int) -> list[int]:
    """Keys of one sequence's blocks (distinct per name)."""
    return [name * 1000 + i for i in range(length)]


def test_the_longest_cached_prefix_is_found_for_every_split() -> None:
    keys = _chain(1, 9)
    for cached in range(len(keys) + 1):
        cache = BlockCache(capacity=100)
        if cached:
            cache.store(keys[:cached], parent=None)
        assert cache.longest_prefix(np.array(keys, dtype=np.uint64)) == cached
    assert BlockCache(capacity=4).longest_prefix(np.array([], dtype=np.uint64)) == 0


def test_a_block_is_stored_only_after_its_parent() -> None:
    cache = BlockCache(capacity=10)
    cache.store([1, 2], parent=None)
    cache.store([3], parent=2)
    with pytest.raises(ValueError, match="parent"):
        cache.store([5], parent=4)


def test_eviction_takes_the_least_recently_used_chain_tail_first() -> None:
    cache = BlockCache(capacity=8)  # evicts down to 8 - 0 = 8 blocks
    old, recent = _chain(1, 4), _chain(2, 4)
    cache.store(old, parent=None)
    cache.store(recent, parent=None)
    assert cache.longest_prefix(np.array(old, dtype=np.uint64)) == 4  # a hit on the deepest block: old is recent
    cache.store(_chain(3, 2), parent=None)  # 10 blocks: the two oldest go, the tail of `recent`
    assert cache.longest_prefix(np.array(old, dtype=np.uint64)) == 4
    assert cache.longest_prefix(np.array(recent, dtype=np.uint64)) == 2


def test_the_cache_stays_prefix_closed_under_random_work() -> None:
    """Every cached block's parent is cached, whatever was looked up, stored and evicted (so the binary search
    finds what a scan from the first block would)."""
    rng = random.Random(0)
    cache = BlockCache(capacity=40)
    chains: list[list[int]] = []
    for step in range(2000):
        if chains and rng.random() < 0.5:
            chain = rng.choice(chains)
            keys = np.array(chain, dtype=np.uint64)
            hits = cache.longest_prefix(keys)
            scan = next((i for i, key in enumerate(chain) if key not in cache), len(chain))
            assert hits == scan
            if hits < len(chain):
                cache.store(chain[hits:], parent=chain[hits - 1] if hits else None)
        else:
            base = rng.choice(chains)[: rng.randint(0, 6)] if chains and rng.random() < 0.5 else []
            chain = base + [step * 100 + i for i in range(rng.randint(1, 8))]
            chains.append(chain)
            hits = cache.longest_prefix(np.array(base, dtype=np.uint64)) if base else 0
            cache.store(chain[hits:], parent=chain[hits - 1] if hits else None)
        assert len(cache) <= 40
        for chain in chains:
            present = [key in cache for key in chain]
            assert present == sorted(present, reverse=True)  # cached blocks form a prefix of every chain
