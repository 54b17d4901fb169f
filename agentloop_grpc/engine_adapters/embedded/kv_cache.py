"""SlotKVCache: one preallocated KV buffer per layer, one slot (row) per running request.

Layout per layer: ``[slots, kv_heads, max_model_len, head_dim]`` for keys and for values. The scheduler keeps the
decoding requests in slots ``[0, m)`` and requests still in prefill right after them, so a batched decode step
reads a plain view ``keys[:m, :, :length]`` with no gather. When a request leaves, the scheduler moves another
request's rows into the hole (``move``): one copy per departure instead of a gather per step.

Buffers are allocated by ``allocate`` and dropped by ``release`` (Sleep). On the CPU they are mmap-backed
allocations, so freeing them returns the memory to the OS; on a GPU they are plain zeroed tensors, which the caching
allocator gives back once ``memory.trim`` empties its cache.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    layers: int
    slots: int
    kv_heads: int
    max_len: int
    head_dim: int

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 4


def _untouched_zeros(dims: tuple[int, ...]) -> torch.Tensor:
    """float32 zeros in an anonymous mapping: the kernel gives a page its memory at its first write, so a server
    holds the KV its requests use, not its whole budget (``torch.zeros`` writes every page); freed on release."""
    count = math.prod(dims)
    return torch.frombuffer(mmap.mmap(-1, count * 4), dtype=torch.float32, count=count).view(dims)


def _zeros(dims: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # zeros, not empty: a masked position's value is multiplied by a zero weight, and garbage could be NaN
    return _untouched_zeros(dims) if device.type == "cpu" else torch.zeros(dims, device=device)


class SlotKVCache:
    """Per-layer key and value buffers indexed by slot, on ``device``."""

    def __init__(self, shape: KVShape, device: torch.device | None = None) -> None:
        self.shape = shape
        self.device = device or torch.device("cpu")
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        """Bytes the buffers take once allocated (the whole budget: on the CPU only touched pages are resident)."""
        s = self.shape
        return s.slots * s.max_len * s.bytes_per_token

    @property
    def allocated(self) -> bool:
        return bool(self.keys)

    def allocate(self) -> None:
        if self.allocated:
            return
        s = self.shape
        dims = (s.slots, s.kv_heads, s.max_len, s.head_dim)
        self.keys = [_zeros(dims, self.device) for _ in range(s.layers)]
        self.values = [_zeros(dims, self.device) for _ in range(s.layers)]

    def release(self) -> None:
        self.keys, self.values = [], []

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        if src == dst or length == 0:
            return
        for buffer in (*self.keys, *self.values):
            buffer[dst, :, :length] = buffer[src, :, :length]

    def read(self, slot: int, start: int, end: int) -> torch.Tensor:
        """A copy of positions [start, end) of one slot: ``[layers, 2, kv_heads, end - start, head_dim]``."""
        return torch.stack(
            [torch.stack((k[slot, :, start:end], v[slot, :, start:end])) for k, v in zip(self.keys, self.values)]
        )

    def write(self, slot: int, start: int, block: torch.Tensor) -> None:
        """Write a tensor shaped like ``read``'s result at positions [start, start + block length)."""
        end = start + block.shape[3]
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            k[slot, :, start:end] = block[layer, 0]
            v[slot, :, start:end] = block[layer, 1]
