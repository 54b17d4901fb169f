"""Routed expert ids on the wire: agentloop.v1's packing of the experts each token of a MoE model was routed to.

Per token, ``layers x per_token`` ids, layer-major, each layer's ids in the router's order; each id is a
little-endian uint8 when the model has at most 256 experts, else uint16: the smallest fixed width that holds every
id, so a turn's routing is one bytes field that numpy reads without a copy (TokenChunk.routed_experts,
GenerateComplete.prompt_routed_experts; docs/contract.md gives the size bound).

``Routing`` is a trajectory's routing: one row per input position of ``prompt_ids + response_ids`` from position
0, at most ``N - 1`` rows (N their total length: the last token is never an input to a forward whose output is
used). It has exactly ``N - 1`` unless the trajectory ends in tokens no generation read (a tool result appended
after the last turn): those trailing positions' routing is unknown and left out (``to_batch`` marks them -1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UINT8_EXPERTS = 256
#: The most experts per layer whose ids a trainer's int16 batch holds (ids 0 .. 32,767; -1 marks unknown).
BATCH_EXPERTS = 1 << 15
#: Config fields that give a model's routed experts per MoE layer, by family (Qwen/OLMoE, Mixtral, DeepSeek, Dbrx).
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def expert_count(config: object) -> int:
    """Routed experts per MoE layer in a Hugging Face text config (0: a dense model)."""
    return next((int(getattr(config, name)) for name in EXPERT_COUNT_FIELDS if getattr(config, name, None)), 0)


def id_dtype(num_experts: int) -> np.dtype:
    """The wire type of one expert id for a model with ``num_experts`` experts per MoE layer."""
    return np.dtype("u1") if num_experts <= UINT8_EXPERTS else np.dtype("<u2")


def pack(ids: np.ndarray, num_experts: int) -> bytes:
    """``ids`` (``[..., layers, per_token]``, any integer type, in ``[0, num_experts)``) as wire bytes."""
    return np.ascontiguousarray(ids, dtype=id_dtype(num_experts)).tobytes()


def unpack(data: bytes, layers: int, per_token: int, num_experts: int) -> np.ndarray:
    """Wire bytes as ``[tokens, layers, per_token]`` ids (a read-only view of ``data``)."""
    return np.frombuffer(data, dtype=id_dtype(num_experts)).reshape(-1, layers, per_token)


def wire_bytes(tokens: int, layers: int, per_token: int, num_experts: int) -> int:
    """Bytes the routing of ``tokens`` tokens takes in a message's bytes field."""
    return tokens * layers * per_token * id_dtype(num_experts).itemsize


@dataclass(frozen=True)
class Routing:
    """The packed routing of input positions ``0 .. positions - 1`` of a trajectory (see the module docstring)."""

    layers: int
    per_token: int
    num_experts: int
    ids: bytes

    def __post_init__(self) -> None:
        if min(self.layers, self.per_token, self.num_experts) <= 0 or len(self.ids) % self.row_bytes:
            raise ValueError(
                f"routing of {len(self.ids)} bytes is not whole rows of {self.layers} layers x {self.per_token} "
                f"experts of {self.num_experts}")

    @property
    def row_bytes(self) -> int:
        """Bytes of one position's routing."""
        return wire_bytes(1, self.layers, self.per_token, self.num_experts)

    @property
    def positions(self) -> int:
        """Input positions covered, from position 0."""
        return len(self.ids) // self.row_bytes

    def array(self) -> np.ndarray:
        """``[positions, layers, per_token]`` expert ids (a read-only view)."""
        return unpack(self.ids, self.layers, self.per_token, self.num_experts)


def placed(routings: Sequence[Routing | None], starts: Sequence[int], width: int) -> np.ndarray | None:
    """Each row's routing from column ``starts[row]`` of a batch whose rows are ``width`` long (a trainer's padded
    ids): int16 ``[rows, width, layers, per_token]``, -1 where unknown (padding, positions a routing does not cover,
    rows without one); None when no row has routing. ValueError for rows of different shapes, a routing that
    overruns its row, or a model with more experts than int16 ids hold (BATCH_EXPERTS)."""
    known = [r for r in routings if r is not None]
    if not known:
        return None
    shapes = {(r.layers, r.per_token) for r in known}
    if len(shapes) > 1:
        raise ValueError(f"rows carry routing of different shapes (layers, top-k): {sorted(shapes)}")
    layers, per_token = shapes.pop()
    widest = max(r.num_experts for r in known)
    if widest > BATCH_EXPERTS:  # a larger id would wrap to a negative one, which reads as unknown
        raise ValueError(f"routing of a model with {widest} experts per layer does not fit the batch's int16 ids "
                         f"(at most {BATCH_EXPERTS} experts)")
    out = np.full((len(routings), width, layers, per_token), -1, dtype=np.int16)
    for row, (routing, start) in enumerate(zip(routings, starts, strict=True)):
        if routing is not None and routing.positions:
            if start + routing.positions > width:
                raise ValueError(f"row {row}: routing of {routing.positions} positions from {start} overruns its "
                                 f"{width} columns")
            out[row, start : start + routing.positions] = routing.array()
    return out


@dataclass(frozen=True, slots=True)
class TurnRouting:
    """One generation's routing as a Router returns it, however many attempts produced it: ``prompt`` holds the
    call's prompt positions ``0 .. P - 2`` (empty when no attempt reported them), ``tokens`` one row per generated
    token (each token's own: a resumed attempt's tokens carry theirs)."""

    layers: int
    per_token: int
    num_experts: int
    prompt: bytes
    tokens: bytes

    @property
    def row_bytes(self) -> int:
        return wire_bytes(1, self.layers, self.per_token, self.num_experts)
