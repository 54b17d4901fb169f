"""PrefixCache: KV of already-computed token prefixes, in fixed-size blocks, LRU-bounded.

A block's key chains the key of the block before it with its own tokens, so a key names a whole prefix; the
entry also keeps its tokens and its parent key, and a lookup compares them, so a hash collision can never serve
foreign KV. A hit copies the blocks into the new request's slot and its prefill starts after them. At most
``len(prompt) - 1`` tokens are served from the cache: the last prompt token is always computed, because its
logits choose the first generated token.

Exactness: cached KV was computed by the same model for the same tokens at the same positions; the only
difference from a cold run is the chunking of the matmuls, which changes results in the last float bits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class _Block:
    parent: int | None
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2, kv_heads, block_size, head_dim]


class PrefixCache:
    """Block-keyed LRU of KV tensors, with hit accounting for GetLoad."""

    def __init__(self, block_size: int, capacity_tokens: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        #: Bumped by every clear: KV computed before a clear (e.g. with old weights) must not come back later.
        self.epoch = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, tokens: Sequence[int], limit: int) -> list[tuple[int | None, int, tuple[int, ...]]]:
        """(parent key, key, tokens) of every full block within tokens[:limit]."""
        size, parent, keys = self.block_size, None, []
        for start in range(0, limit - size + 1, size):
            block = tuple(tokens[start : start + size])
            key = hash((parent, block))
            keys.append((parent, key, block))
            parent = key
        return keys

    def block_keys(self, prompt: Sequence[int]) -> list[int]:
        """Keys of the blocks a lookup of ``prompt`` would try (none when the cache is disabled)."""
        return [key for _, key, _ in self._keys(prompt, len(prompt) - 1)] if self.enabled else []

    def lookup(self, prompt: Sequence[int]) -> list[torch.Tensor]:
        """The KV blocks of the longest cached prefix of ``prompt[:-1]`` (refreshing their LRU position)."""
        found = []
        if self.enabled:
            for parent, key, tokens in self._keys(prompt, len(prompt) - 1):
                block = self._blocks.get(key)
                if block is None or block.parent != parent or block.tokens != tokens:
                    break
                self._blocks.move_to_end(key)
                found.append(block.kv)
        return found

    def record(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def missing(self, tokens: Sequence[int]) -> list[tuple[int, int | None, int, tuple[int, ...]]]:
        """(start, parent, key, tokens) of the full blocks of ``tokens`` not cached yet (their KV is wanted)."""
        if not self.enabled:
            return []
        out = []
        for index, (parent, key, block) in enumerate(self._keys(tokens, len(tokens))):
            if key in self._blocks and self._blocks[key].tokens == block:
                self._blocks.move_to_end(key)
            else:
                out.append((index * self.block_size, parent, key, block))
        return out

    def insert(self, parent: int | None, key: int, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        self._blocks[key] = _Block(parent, tokens, kv)
        self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
        self.epoch += 1
        self.prompt_tokens = self.cached_tokens = 0
