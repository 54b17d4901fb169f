"""What both ends of the wire share: proto <-> domain mappings a client needs as much as a server."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .prompt import PromptIds
from .types import FinishReason, PauseMode, Resource, SamplingParams, StructuredOutput, TokenChunk

_LITTLE_ENDIAN = sys.byteorder == "little"

FINISH_REASONS = {
    FinishReason.STOP: generation_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: generation_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: generation_pb2.FINISH_REASON_ABORT,
}
FINISH_REASONS_FROM_PROTO = {code: reason for reason, code in FINISH_REASONS.items()}

PAUSE_MODES = {
    PauseMode.ABORT: engine_pb2.PAUSE_MODE_ABORT,
    PauseMode.KEEP: engine_pb2.PAUSE_MODE_KEEP,
    PauseMode.WAIT: engine_pb2.PAUSE_MODE_WAIT,
}
RESOURCE_TAGS = {
    Resource.WEIGHTS: engine_pb2.WAKE_UP_TAG_WEIGHTS,
    Resource.KV_CACHE: engine_pb2.WAKE_UP_TAG_KV_CACHE,
}
#: Sleep level (1: the KV cache; 2: the KV cache and the weights) -> SleepLevel.
SLEEP_LEVELS = {1: engine_pb2.SLEEP_LEVEL_KV_CACHE, 2: engine_pb2.SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS}

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


def prompt_to_raw(prompt_ids: Iterable[int]) -> bytes:
    """The prompt as GenerateRequest.prompt_ids_raw (little-endian int32), cheaper for Python's protobuf at both
    ends than the repeated field. Ids that are int32 already (``PromptIds``, an ``array('i')``, such as an agent
    loop's growing context) are copied as they are, not packed. ValueError for ids outside int32."""
    if isinstance(prompt_ids, PromptIds):
        return prompt_ids.raw
    if isinstance(prompt_ids, array) and prompt_ids.typecode == "i" and prompt_ids.itemsize == 4:
        if _LITTLE_ENDIAN:
            return prompt_ids.tobytes()
        swapped = array("i", prompt_ids)
        swapped.byteswap()
        return swapped.tobytes()
    ids = prompt_ids if isinstance(prompt_ids, (list, tuple)) else list(prompt_ids)
    try:
        return struct.pack(f"<{len(ids)}i", *ids)
    except struct.error as exc:
        raise ValueError(f"prompt ids must be int32: {exc}") from exc


def fill_sampling(message: generation_pb2.SamplingParams, sampling: SamplingParams, max_new_tokens: int) -> None:
    """Client side: write ``sampling`` into an empty message, with ``max_new_tokens`` as the budget."""
    message.max_new_tokens = max_new_tokens
    message.temperature = sampling.temperature
    message.top_p = sampling.top_p
    message.top_k = sampling.top_k
    message.min_p = sampling.min_p
    message.repetition_penalty = sampling.repetition_penalty
    message.presence_penalty = sampling.presence_penalty
    message.frequency_penalty = sampling.frequency_penalty
    if sampling.seed is not None:
        message.seed = sampling.seed
    message.stop_token_ids.extend(sampling.stop_token_ids)
    message.ignore_eos = sampling.ignore_eos
    message.logprobs = sampling.logprobs
    message.top_logprobs = sampling.top_logprobs
    message.return_routed_experts = sampling.return_routed_experts


def fill_structured_output(message: generation_pb2.StructuredOutput, structured: StructuredOutput) -> None:
    """Client side: set the message's constraint to ``structured``."""
    setattr(message, structured.kind, structured.spec)


def chunk_from_proto(chunk: generation_pb2.TokenChunk) -> TokenChunk:
    """Client side: a received chunk as the domain type."""
    return TokenChunk(
        token_ids=tuple(chunk.token_ids),
        weight_version=chunk.weight_version,
        logprobs=tuple(chunk.logprobs),
        top_logprobs=tuple(tuple(zip(alt.token_ids, alt.logprobs, strict=True)) for alt in chunk.top_logprobs),
        routed_experts=chunk.routed_experts,
    )
