"""BlockCache: the fake engine's prefix cache of full blocks, bounded, least recently used out first.

Keys are BlockKeys' (a block's key stands for its whole prefix). The cache stays *prefix-closed*: a block is
stored only with or after its parent (the block before it in the same sequence), and eviction takes a block's
descendants with it or before it, as vLLM does by freeing a request's blocks tail first. That makes a lookup a
binary search for the longest cached prefix (about 7 probes for a 2,000-token prompt's 125 blocks, where a scan
costs 125 dict lookups) and lets a hit touch only its deepest block, not all of them: a block's recency is the
latest use of it or of any descendant, worked out when evicting, which is rare
(once per capacity/16 new blocks).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


class BlockCache:
    """Prefix-closed block cache with LRU eviction; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # key -> last use (a counter); insertion order puts every parent before its children
        self._used: dict[int, int] = {}
        self._parents: dict[int, int | None] = {}  # key -> the key of the block before it (None: first block)
        self._uses = itertools.count()

    def __len__(self) -> int:
        return len(self._used)

    def __contains__(self, key: int) -> bool:
        return key in self._used

    def longest_prefix(self, keys: np.ndarray) -> int:
        """How many of ``keys`` (one sequence's block keys, in order) are cached; the deepest of them is used."""
        used = self._used
        count = len(keys)
        if not count or int(keys[0]) not in used:
            return 0
        if int(keys[-1]) in used:  # the common case in multi-turn work: the whole prompt was seen
            hits = count
        else:  # keys[:low] cached (prefix-closed), keys[high] not
            low, high = 1, count - 1
            while low < high:
                middle = (low + high) // 2
                if int(keys[middle]) in used:
                    low = middle + 1
                else:
                    high = middle
            hits = low
        used[int(keys[hits - 1])] = next(self._uses)
        return hits

    def store(self, keys: Sequence[int], parent: int | None) -> None:
        """Store one sequence's consecutive blocks ``keys``, which follow the cached block ``parent`` (None when
        they start the sequence); evict the least recently used blocks beyond the capacity."""
        if parent is not None and parent not in self._used:
            raise ValueError("a block is stored only after its parent (the cache stays prefix-closed)")
        use = next(self._uses)
        self._used.update(zip(keys, itertools.repeat(use)))
        self._parents.update(zip(keys, itertools.chain((parent,), keys)))
        if len(self._used) > self.capacity:
            self._evict()

    def clear(self) -> None:
        self._used.clear()
        self._parents.clear()

    def _evict(self) -> None:
        """Down to 15/16 of the capacity (the sort is paid once per capacity/16 new blocks), oldest first; a
        block counts as used when any descendant was, and among equals descendants go first, so no cached block
        ever loses its parent."""
        recency = dict(self._used)
        for key in reversed(self._used):  # children before their parents
            parent = self._parents[key]
            if parent is not None and recency[key] > recency[parent]:
                recency[parent] = recency[key]
        keep = self.capacity - self.capacity // 16
        # reversed insertion order, then a stable sort: among equal recency, later (deeper) blocks come first
        for key in sorted(reversed(self._used), key=recency.__getitem__)[: len(self._used) - keep]:
            del self._used[key]
            del self._parents[key]
