"""BlockKeys: prefix-cache keys of a token sequence's full blocks, computed with numpy (the fake engine's cache).

A block's key must depend on every token up to the block's end, as a chain of block hashes does in vLLM. A chain
costs one Python step per block, which was the fake's largest cost per request (figures in NOTES.md).
Here a key is a polynomial hash of the whole prefix instead, mod 2**64: prefix sums of ``(token + 1) * P**position``
are one vectorised cumsum, a block's key is the prefix sum at its end mixed with that end, and the sums extend
without recomputing the prefix (prompt, then prompt + output). Deterministic in every process (no ``hash()`` of
str or bytes, whose seed differs between processes). Not collision-proof against adversaries, which a test
double does not need.
"""

from __future__ import annotations

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: its powers never vanish mod 2**64
_MIX_SUM = np.uint64(0xBF58476D1CE4E5B9)
_MIX_END = np.uint64(0x94D049BB133111EB)


class BlockKeys:
    """Prefix sums and block keys for sequences of up to any length (the tables grow on demand)."""

    def __init__(self, block_size: int, expected_len: int = 4096) -> None:
        self.block_size = block_size
        self._powers = self._power_sums = self._end_mix = np.empty(0, dtype=np.uint64)
        self._grow(expected_len)

    def _grow(self, length: int) -> None:
        if length > self._powers.size:
            size = max(length, 2 * self._powers.size)
            self._powers = np.cumprod(np.full(size, _BASE, dtype=np.uint64))  # P**1 .. P**size
            self._power_sums = np.cumsum(self._powers, dtype=np.uint64)  # the "+ 1" of every token, summed
            self._end_mix = np.arange(size + 1, dtype=np.uint64) * _MIX_END  # a block end's share of its key

    def prefix_sums(self, tokens: np.ndarray, offset: int = 0, start: int = 0) -> np.ndarray:
        """``sums[i]`` = hash of the sequence up to and including ``tokens[i]``, where ``tokens`` sit at positions
        ``offset``.. of a sequence whose prefix before them hashes to ``start`` (the previous sums' last value)."""
        end = offset + tokens.size
        self._grow(end)
        # sum of (token + 1) * P**position, as sum(token * P**position) + sum(P**position); uint64 array arithmetic
        # wraps mod 2**64 silently (numpy warns about overflow only for scalars); in place: one array, no temporaries
        sums = tokens.astype(np.uint64)
        sums *= self._powers[offset:end]
        np.cumsum(sums, out=sums)
        sums += self._power_sums[offset:end]
        if offset:
            sums -= self._power_sums[offset - 1]
        if start:
            sums += np.uint64(start)
        return sums

    def keys(self, sums: np.ndarray, start: int, limit: int) -> np.ndarray:
        """Keys of the full blocks that end in (``start``, ``limit``] (``start`` a block boundary), as uint64."""
        size = self.block_size
        mixed = sums[start + size - 1 : limit : size] * _MIX_SUM
        mixed ^= self._end_mix[start + size : limit + 1 : size]
        return mixed
