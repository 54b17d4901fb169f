"""What both ends of a weight-transfer group agree on: the group's spec, the announced tensors and the layout of
their bytes in the broadcast (``weight_group.py`` moves them; this module needs no torch to import).

An update is announced first (``TensorSpec``s, in order) and then broadcast as ``BucketLayout`` says: the
tensors' bytes end to end, each at a 64-byte aligned offset (so every tensor can be read as a view of the
received bytes), cut into pieces of ``bucket_bytes`` (so neither end needs more than one piece of extra memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ALIGN = 64
MIN_BUCKET_BYTES = 1 << 20
MAX_BUCKET_BYTES = 4 << 30
DEFAULT_BUCKET_BYTES = 128 << 20
DEFAULT_TIMEOUT_S = 300.0
BACKENDS = ("gloo", "nccl")

_ITEM_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}


class WeightGroupError(RuntimeError):
    """The group could not form, or a collective of it failed (a rank left or timed out)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One announced tensor: the name, dtype (``NamedTensor.dtype`` names) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEM_BYTES[self.dtype]


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """Where each tensor lies in the broadcast byte range, and the pieces it is sent in."""

    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    total_bytes: int
    bucket_bytes: int

    @classmethod
    def of(cls, specs: Sequence[TensorSpec], bucket_bytes: int) -> BucketLayout:
        offsets, end = [], 0
        for spec in specs:
            start = -(-end // ALIGN) * ALIGN
            offsets.append(start)
            end = start + spec.nbytes
        return cls(tuple(specs), tuple(offsets), end, bucket_bytes)

    def pieces(self) -> Iterator[tuple[int, int]]:
        for start in range(0, self.total_bytes, self.bucket_bytes):
            yield start, min(start + self.bucket_bytes, self.total_bytes)

    def views(self, flat: torch.Tensor) -> list[tuple[TensorSpec, torch.Tensor]]:
        """Each tensor as a view of the received ``flat`` bytes."""
        import torch  # only engine workers and trainers need torch; the layout itself does not

        return [
            (spec, flat[offset : offset + spec.nbytes].view(getattr(torch, spec.dtype)).reshape(spec.shape))
            for spec, offset in zip(self.specs, self.offsets)
        ]


@dataclass(frozen=True, slots=True)
class WeightGroupSpec:
    """Where a group forms (the trainer's rendezvous) and its size; ``rank_offset`` is a server's first rank."""

    name: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    backend: str = "gloo"
    timeout_s: float = DEFAULT_TIMEOUT_S

    def problem(self, ranks: int) -> str | None:
        """Why a server with ``ranks`` workers cannot join this group as specified; None if it can."""
        if not self.name:
            return "group_name must not be empty"
        if self.backend not in BACKENDS:
            return f"backend {self.backend!r} must be one of {', '.join(BACKENDS)}"
        if self.backend == "nccl" and not _has_gpu():
            return "backend 'nccl' needs GPUs, and this server has none: use 'gloo'"
        if not 1 <= self.master_port <= 65535:
            return f"master_port {self.master_port} must be in 1..65535"
        if not self.master_address:
            return "master_address must not be empty"
        if self.rank_offset < 1 or self.rank_offset + ranks > self.world_size:
            return (
                f"ranks {self.rank_offset}..{self.rank_offset + ranks - 1} must lie in 1..{self.world_size - 1} "
                f"(world_size {self.world_size}; rank 0 is the trainer's)"
            )
        if self.timeout_s <= 0:
            return f"timeout_s {self.timeout_s} must be positive"
        return None


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
