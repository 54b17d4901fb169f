"""Reassembly of the UpdateWeights client stream into complete named tensors.

A tensor may arrive split over several TensorChunk messages (gRPC messages are bounded); the chunks of one
tensor carry the same name, dtype and shape with increasing byte offsets. Everything is checked here, before any
adapter sees a byte, so a bad stream changes nothing in the engine.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.common.wire import DTYPES
from agentloop_grpc.v1 import engine_pb2


class _PartialTensor:
    """Bytes of one tensor as they arrive."""

    def __init__(self, chunk: engine_pb2.TensorChunk) -> None:
        if chunk.dtype not in DTYPES:
            raise InvalidRequestError(f"tensor {chunk.name!r}: dtype is unspecified or unknown ({chunk.dtype})")
        if any(d < 0 for d in chunk.shape):
            raise InvalidRequestError(f"tensor {chunk.name!r}: shape {list(chunk.shape)} has a negative dimension")
        self.name = chunk.name
        self.dtype_code = chunk.dtype
        self.shape = tuple(chunk.shape)
        self.total = math.prod(self.shape) * DTYPES[chunk.dtype][1]
        self.buffer = bytearray()

    def add(self, chunk: engine_pb2.TensorChunk) -> None:
        if chunk.dtype != self.dtype_code or tuple(chunk.shape) != self.shape:
            raise InvalidRequestError(f"tensor {self.name!r}: a later chunk changed dtype or shape")
        if chunk.offset != len(self.buffer):
            raise InvalidRequestError(
                f"tensor {self.name!r}: chunk offset {chunk.offset}, expected {len(self.buffer)} (chunks in order)"
            )
        if len(self.buffer) + len(chunk.data) > self.total:
            raise InvalidRequestError(
                f"tensor {self.name!r}: {len(self.buffer) + len(chunk.data)} bytes exceed shape "
                f"{list(self.shape)} x {DTYPES[self.dtype_code][1]} bytes = {self.total}"
            )
        self.buffer += chunk.data

    @property
    def complete(self) -> bool:
        return len(self.buffer) == self.total

    def finish(self) -> NamedTensor:
        return NamedTensor(self.name, DTYPES[self.dtype_code][0], self.shape, bytes(self.buffer))


async def read_weight_stream(
    stream: AsyncIterator[engine_pb2.UpdateWeightsRequest],
) -> tuple[list[NamedTensor], engine_pb2.UpdateWeightsCommit, int]:
    """Return (tensors, commit, bytes received); raise InvalidRequestError on any inconsistency."""
    tensors: list[NamedTensor] = []
    names: set[str] = set()
    partial: _PartialTensor | None = None
    received = 0
    commit: engine_pb2.UpdateWeightsCommit | None = None
    async for message in stream:
        if commit is not None:
            raise InvalidRequestError("a message followed the commit; the commit must be the last message")
        kind = message.WhichOneof("item")
        if kind == "commit":
            commit = message.commit
            continue
        if kind != "tensor":
            raise InvalidRequestError("an UpdateWeightsRequest carries neither tensor nor commit")
        chunk = message.tensor
        received += len(chunk.data)
        if partial is None:
            if not chunk.name:
                raise InvalidRequestError("tensor name is required")
            if chunk.name in names:
                raise InvalidRequestError(f"tensor {chunk.name!r} was sent twice")
            partial = _PartialTensor(chunk)
        elif chunk.name != partial.name:
            raise InvalidRequestError(
                f"tensor {partial.name!r} is incomplete ({len(partial.buffer)} of {partial.total} bytes) "
                f"when tensor {chunk.name!r} starts"
            )
        partial.add(chunk)
        if partial.complete:
            tensors.append(partial.finish())
            names.add(partial.name)
            partial = None
    if partial is not None:
        raise InvalidRequestError(
            f"tensor {partial.name!r} is incomplete ({len(partial.buffer)} of {partial.total} bytes)"
        )
    if commit is None:
        raise InvalidRequestError("the stream ended without a commit message; nothing was applied")
    return tensors, commit, received
