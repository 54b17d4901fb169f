"""PrefixIndex: which servers the Router sent which prompt prefixes to, so a new session can go where its prompt is
cached (``cache_aware`` placement).

An approximation of the servers' prefix caches kept on the client side, as SGLang's router keeps one: a block of a
prompt is named by a hash chained over every block before it (a block's key names its whole prefix), and each key
remembers the servers it was sent to. Only first requests are recorded and looked up (a sticky session's later
turns cost no hashing), at most ``MAX_BLOCKS`` blocks of each prompt. Memory is bounded by ``max_blocks`` keys over
all servers, least recently used out first; a weight update makes every entry stale (caches keyed by version no
longer serve them), so the Router clears the index then.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

#: Blocks of a prompt hashed at most: the shared part of agentic prompts (system prompt, tools, task) comes first.
MAX_BLOCKS = 64


class PrefixIndex:
    """Chained block keys -> the servers they were sent to; bounded LRU (see the module docstring)."""

    def __init__(self, max_blocks: int, block_tokens: int) -> None:
        self._max = max_blocks
        self._block_bytes = 4 * block_tokens
        self._servers: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._servers)

    def keys(self, raw_prompt: bytes) -> list[bytes]:
        """The chained keys of the prompt's whole blocks (``raw_prompt``: int32 ids as bytes, the wire's form)."""
        if not self._max:
            return []
        size = self._block_bytes
        view = memoryview(raw_prompt)
        keys: list[bytes] = []
        previous = b""
        for start in range(0, min(len(view) // size, MAX_BLOCKS) * size, size):
            previous = hashlib.blake2b(view[start:start + size], digest_size=12, key=previous).digest()
            keys.append(previous)
        return keys

    def matched(self, keys: list[bytes]) -> dict[str, int]:
        """For every server holding a prefix of these keys: how many leading blocks it holds."""
        found: dict[str, int] = {}
        servers = self._servers
        for count, key in enumerate(keys, start=1):
            holders = servers.get(key)
            if holders is None:
                break  # a key names its whole prefix: nothing after a miss can be held
            for address in holders:
                found[address] = count
        return found

    def record(self, keys: list[bytes], address: str) -> None:
        """``address`` was sent a prompt with these keys."""
        servers = self._servers
        # leading blocks last, so they are the most recent: the deepest blocks leave first, and a prefix never
        # loses its start while its end is remembered
        for key in reversed(keys):
            holders = servers.get(key, ())
            if address not in holders:
                holders = (*holders, address)
            servers[key] = holders
            servers.move_to_end(key)
        while len(servers) > self._max:
            servers.popitem(last=False)

    def clear(self) -> None:
        self._servers.clear()
