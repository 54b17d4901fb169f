"""Routed expert ids on the wire: agentloop.v1's packing of the experts each token of a MoE model was routed to.

Per token, ``layers x per_token`` ids, layer-major, each layer's ids in the router's order; each id is a
little-endian uint8 when the model has at most 256 experts, else uint16: the smallest fixed width that holds every
id, so a turn's routing is one bytes field that numpy reads without a copy (TokenChunk.routed_experts,
GenerateComplete.prompt_routed_experts; docs/contract.md gives the size bound).
"""

from __future__ import annotations

import numpy as np

UINT8_EXPERTS = 256


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
