"""PrefixCache: KV of already-computed token prefixes, in fixed-size blocks, LRU-bounded.

Blocks are keyed by a request's BlockChain (``block_hash.py``), hashed once when the request arrives and extended
by its output, so admission and lookups never rehash a prompt. A key names a whole prefix; the entry also keeps
its block's ids and its parent key, and a lookup compares them, so a hash collision can never serve foreign KV.
A hit copies the blocks into the new request's slot and its prefill starts after them. At most
``len(prompt) - 1`` tokens are served from the cache: the last prompt token is always computed, because its
logits choose the first generated token.

Weights: every chain is rooted in the cache's ``epoch`` (``block_hash.py``), which a weight update bumps
(``advance``), so KV of other weights is never matched, and the blocks of before become *stale*: kept, unreachable,
and evicted before every current block. FlushCache (``clear``) drops everything. Requests waiting when the epoch
changes are hashed again at admission (``scheduler.py``); those running then never store their KV.

Sessions: ``sessions`` (``session_blocks.py``) remembers the blocks each session's latest request left; EndSessions
(``end_sessions``) moves those no live session holds to the evict-first end, behind only the stale blocks. The
cache holds copies (a hit copies blocks into the request's slot), so no running request ever depends on a cached
block: demoting or evicting one never breaks a request, it only costs a later one its hit.

Exactness: cached KV was computed by the same model for the same tokens at the same positions; the only
difference from a cold run is the chunking of the matmuls, which changes results in the last float bits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentloop_grpc.common.media import MediaInput

from ..block_hash import BlockChain
from ..session_blocks import SessionBlocks, demote

#: Block keys the session table may hold per cache block: room for every cached block to be held by a few
#: sessions (a GRPO group's shared prompt by each sample), bounded by the cache however many sessions run.
_SESSION_KEYS_PER_BLOCK = 4


@dataclass(frozen=True, slots=True)
class _Block:
    parent: int | None  # the previous block's key; block 0's: its chain's root (the epoch it was computed in)
    ids: bytes  # the block's token ids, as BlockChain.block gives them
    kv: torch.Tensor  # [layers, 2, kv_heads, block_size, head_dim]


class PrefixCache:
    """Block-keyed LRU of KV tensors, with hit accounting for GetLoad."""

    def __init__(self, block_size: int, capacity_tokens: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        #: Blocks computed by weights replaced since (``advance``): never served, evicted before any in ``_blocks``.
        self._stale: OrderedDict[int, _Block] = OrderedDict()
        #: Bumped by every clear and weight update; the root of every chain made since. KV computed before (e.g.
        #: with old weights) must not come back later.
        self.epoch = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.sessions = SessionBlocks(_SESSION_KEYS_PER_BLOCK * self.capacity_blocks)

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        """Blocks held, stale ones included."""
        return len(self._blocks) + len(self._stale)

    @property
    def stale_blocks(self) -> int:
        return len(self._stale)

    def chain(self, prompt: Sequence[int], media: Sequence[MediaInput] = ()) -> BlockChain:
        """The block keys of ``prompt``, to extend with its output (none when the cache is disabled); blocks that
        overlap an image of ``media`` are keyed and compared by the image too."""
        if not self.enabled:
            return BlockChain(self.block_size)
        return BlockChain(self.block_size, prompt, media, root=self.epoch)

    def prompt_keys(self, blocks: BlockChain, prompt_len: int) -> list[int]:
        """Keys of the blocks a lookup of a prompt of ``prompt_len`` tokens tries: those within ``prompt[:-1]``."""
        return blocks.keys[: (prompt_len - 1) // self.block_size]

    def lookup(self, blocks: BlockChain, prompt_len: int) -> list[torch.Tensor]:
        """The KV blocks of the longest cached prefix of the prompt's first ``prompt_len - 1`` tokens (refreshing
        their LRU position)."""
        found, parent = [], blocks.root
        for index, key in enumerate(self.prompt_keys(blocks, prompt_len)):
            block = self._blocks.get(key)
            if block is None or block.parent != parent or block.ids != blocks.block(index):
                break
            parent = key
            self._blocks.move_to_end(key)
            found.append(block.kv)
        return found

    def record(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def missing(self, blocks: BlockChain, length: int) -> list[int]:
        """Indexes of the full blocks within the first ``length`` tokens of ``blocks`` not cached yet (their KV is
        wanted); cached ones are refreshed. A colliding key counts as cached: the lookup, which compares, misses it."""
        if not self.enabled:
            return []
        out = []
        for index, key in enumerate(blocks.keys[: length // self.block_size]):
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                out.append(index)
        return out

    def insert(self, blocks: BlockChain, index: int, kv: torch.Tensor) -> None:
        """Cache ``kv`` as block ``index`` of ``blocks``, evicting the least recently used beyond the capacity."""
        key = blocks.keys[index]
        self._blocks[key] = _Block(blocks.keys[index - 1] if index else blocks.root, blocks.block(index), kv)
        self._blocks.move_to_end(key)
        while len(self) > self.capacity_blocks:
            if self._stale:
                self._stale.popitem(last=False)
            else:
                self.sessions.evicted(self._blocks.popitem(last=False)[0])

    def note_session(self, session_id: str, blocks: BlockChain, length: int) -> None:
        """``session_id``'s request has stored its first ``length`` tokens: it holds their cached blocks."""
        if session_id:
            self.sessions.note(session_id, [k for k in blocks.keys[: length // self.block_size] if k in self._blocks])

    def end_sessions(self, session_ids: Sequence[str]) -> int:
        """EndSessions: move the blocks of ``session_ids`` that no live session holds to the evict-first end (stale
        blocks still go before them); return how many moved."""
        return demote(self._blocks, self.sessions.end(session_ids))

    def advance(self) -> None:
        """New weights: what is cached becomes stale (kept until evicted, first; never served) and chains made from
        now on start from a new root."""
        self._stale.update(self._blocks)  # after the older stale blocks: evicted in the order they were last used
        self._blocks.clear()
        self.sessions.clear()  # their blocks are stale: nothing left to demote
        self.epoch += 1

    def clear(self) -> None:
        self._blocks.clear()
        self._stale.clear()
        self.sessions.clear()
        self.epoch += 1
        self.prompt_tokens = self.cached_tokens = 0
