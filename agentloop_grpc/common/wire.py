"""What both ends of the wire share: proto <-> domain mappings a client needs as much as a server."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .types import FinishReason, TokenChunk

FINISH_REASONS = {
    FinishReason.STOP: generation_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: generation_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: generation_pb2.FINISH_REASON_ABORT,
}
FINISH_REASONS_FROM_PROTO = {code: reason for reason, code in FINISH_REASONS.items()}

#: TensorDtype -> (numpy name, bytes per element).
DTYPES = {
    engine_pb2.TENSOR_DTYPE_FLOAT32: ("float32", 4),
    engine_pb2.TENSOR_DTYPE_FLOAT16: ("float16", 2),
    engine_pb2.TENSOR_DTYPE_BFLOAT16: ("bfloat16", 2),
    engine_pb2.TENSOR_DTYPE_FLOAT64: ("float64", 8),
    engine_pb2.TENSOR_DTYPE_INT64: ("int64", 8),
    engine_pb2.TENSOR_DTYPE_INT32: ("int32", 4),
    engine_pb2.TENSOR_DTYPE_INT8: ("int8", 1),
    engine_pb2.TENSOR_DTYPE_UINT8: ("uint8", 1),
    engine_pb2.TENSOR_DTYPE_BOOL: ("bool", 1),
}


def prompt_to_raw(prompt_ids: Sequence[int]) -> bytes | None:
    """The prompt as GenerateRequest.prompt_ids_raw (little-endian int32), cheaper for Python's protobuf at both
    ends than the repeated field; None for ids outside int32 (the repeated field then refuses them)."""
    try:
        return struct.pack(f"<{len(prompt_ids)}i", *prompt_ids)
    except struct.error:
        return None


def chunk_from_proto(chunk: generation_pb2.TokenChunk) -> TokenChunk:
    """Client side: a received chunk as the domain type."""
    return TokenChunk(
        token_ids=tuple(chunk.token_ids),
        weight_version=chunk.weight_version,
        logprobs=tuple(chunk.logprobs),
        top_logprobs=tuple(tuple(zip(alt.token_ids, alt.logprobs, strict=True)) for alt in chunk.top_logprobs),
    )


FINISH_REASONS_FROM_PROTO = {code: reason for reason, code in FINISH_REASONS.items()}
