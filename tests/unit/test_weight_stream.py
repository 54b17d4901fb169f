"""UpdateWeights stream reassembly: split tensors, ordering and byte-count checks."""

from __future__ import annotations

import struct

import pytest

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.engine_adapters.weights import read_weight_stream
from agentloop_grpc.v1 import engine_pb2

F32 = engine_pb2.TENSOR_DTYPE_FLOAT32


async def _stream(*messages):
    for message in messages:
        yield message


def _tensor(name: str, shape: list[int], data: bytes, offset: int = 0, dtype: int = F32):
    return engine_pb2.UpdateWeightsRequest(
        tensor=engine_pb2.TensorChunk(name=name, dtype=dtype, shape=shape, offset=offset, data=data)
    )


COMMIT = engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=7))


async def test_split_tensor_is_reassembled_in_order() -> None:
    values = struct.pack("<6f", *range(6))
    tensors, commit, received = await read_weight_stream(
        _stream(
            _tensor("a", [2, 3], values[:8]),
            _tensor("a", [2, 3], values[8:20], offset=8),
            _tensor("a", [2, 3], values[20:], offset=20),
            _tensor("b", [1], struct.pack("<q", 5), dtype=engine_pb2.TENSOR_DTYPE_INT64),
            COMMIT,
        )
    )
    assert [(t.name, t.dtype, t.shape) for t in tensors] == [("a", "float32", (2, 3)), ("b", "int64", (1,))]
    assert tensors[0].data == values and received == 24 + 8
    assert commit.weight_version == 7


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([_tensor("a", [2], bytes(8))], "without a commit"),
        ([_tensor("a", [2], bytes(4)), COMMIT], "incomplete"),
        ([_tensor("a", [2], bytes(12)), COMMIT], "exceed"),
        ([_tensor("a", [2], bytes(4)), _tensor("a", [2], bytes(4), offset=0), COMMIT], "offset"),
        ([_tensor("a", [2], bytes(4)), _tensor("b", [1], bytes(4)), COMMIT], "incomplete"),
        ([_tensor("a", [1], bytes(4)), _tensor("a", [1], bytes(4)), COMMIT], "sent twice"),
        ([_tensor("a", [2], bytes(4)), _tensor("a", [3], bytes(4), offset=4), COMMIT], "changed dtype or shape"),
        ([_tensor("a", [-1], b""), COMMIT], "negative"),
        ([_tensor("", [1], bytes(4)), COMMIT], "name is required"),
        ([_tensor("a", [1], bytes(4), dtype=engine_pb2.TENSOR_DTYPE_UNSPECIFIED), COMMIT], "dtype"),
        ([COMMIT, _tensor("a", [1], bytes(4))], "followed the commit"),
        ([engine_pb2.UpdateWeightsRequest(), COMMIT], "neither tensor nor commit"),
    ],
)
async def test_inconsistent_streams_are_rejected(messages, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        await read_weight_stream(_stream(*messages))
