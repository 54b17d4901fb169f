"""Results of calls fanned out to every server, and the messages of a weight update."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.common.weight_layout import TensorSpec
from agentloop_grpc.common.wire import DTYPES
from agentloop_grpc.v1 import engine_pb2

from .errors import InfrastructureError

_DTYPE_CODES: dict[str, engine_pb2.TensorDtype.ValueType] = {name: code for code, (name, _size) in DTYPES.items()}

Reply = TypeVar("Reply")


@dataclass
class FanOutResult(Generic[Reply]):
    """Per-server outcome of one control call sent to every server concurrently: each answer in domain types
    (``replies.py``; None for a call whose answer says nothing), or the error the call failed with."""

    responses: dict[str, Reply] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self) -> FanOutResult[Reply]:
        """Raise InfrastructureError naming every server that failed; return self when none did."""
        if self.errors:
            described = "; ".join(f"{address}: {error}" for address, error in sorted(self.errors.items()))
            total = len(self.errors) + len(self.responses)
            raise InfrastructureError(f"{len(self.errors)} of {total} failed: {described}")
        return self


def _dtype_code(name: str, dtype: str) -> engine_pb2.TensorDtype.ValueType:
    if dtype not in _DTYPE_CODES:
        raise ValueError(f"tensor {name!r}: unsupported dtype {dtype!r}")
    return _DTYPE_CODES[dtype]


def tensor_specs(specs: Sequence[TensorSpec]) -> list[engine_pb2.TensorSpec]:
    """The tensors a ReceiveWeights request announces."""
    return [engine_pb2.TensorSpec(name=s.name, dtype=_dtype_code(s.name, s.dtype), shape=s.shape) for s in specs]


def weight_update_messages(
    tensors: Iterable[NamedTensor], weight_version: int | None, flush_cache: bool, chunk_bytes: int
) -> list[engine_pb2.UpdateWeightsRequest]:
    """Split every tensor into messages of at most ``chunk_bytes`` bytes, then the commit."""
    messages = []
    for tensor in tensors:
        dtype = _dtype_code(tensor.name, tensor.dtype)
        offsets = range(0, max(len(tensor.data), 1), chunk_bytes)
        for offset in offsets:
            messages.append(
                engine_pb2.UpdateWeightsRequest(
                    tensor=engine_pb2.TensorChunk(
                        name=tensor.name,
                        dtype=dtype,
                        shape=tensor.shape,
                        offset=offset,
                        data=tensor.data[offset : offset + chunk_bytes],
                    )
                )
            )
    commit = engine_pb2.UpdateWeightsCommit(flush_cache=flush_cache)
    if weight_version is not None:
        commit.weight_version = weight_version
    messages.append(engine_pb2.UpdateWeightsRequest(commit=commit))
    return messages
