"""Conversion between agentloop.v1 messages and the domain types adapters use.

Requests are validated while converted (``validation.py``), so an adapter only ever sees a request that is
within the engine's limits, with every default resolved.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from google.protobuf.message import Message

from agentloop_grpc.common import wire as wire_maps
from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.common.types import (
    EngineState,
    GenerateComplete,
    GenerateRequest,
    LoadInfo,
    SamplingParams,
    ServerFacts,
    StructuredOutput,
    TokenChunk,
)
from agentloop_grpc.common.weight_layout import (
    DEFAULT_TIMEOUT_S,
    MAX_BUCKET_BYTES,
    MIN_BUCKET_BYTES,
    BucketLayout,
    TensorSpec,
    WeightGroupSpec,
)
from agentloop_grpc.common.wire import FINISH_REASONS
from agentloop_grpc.v1 import engine_pb2, generation_pb2

from . import validation
from .grouping import TokenGrouper

ENGINE_STATES = {
    EngineState.LOADING: engine_pb2.ENGINE_STATE_LOADING,
    EngineState.RUNNING: engine_pb2.ENGINE_STATE_RUNNING,
    EngineState.PAUSED: engine_pb2.ENGINE_STATE_PAUSED,
    EngineState.SLEEPING: engine_pb2.ENGINE_STATE_SLEEPING,
    EngineState.DRAINING: engine_pb2.ENGINE_STATE_DRAINING,
}
# The server reads what the client side writes (common/wire.py), so its maps are those inverted.
PAUSE_MODES = {wire: mode for mode, wire in wire_maps.PAUSE_MODES.items()}
WAKE_UP_TAGS = {wire: resource for resource, wire in wire_maps.RESOURCE_TAGS.items()}
SLEEP_LEVELS = {wire: level for level, wire in wire_maps.SLEEP_LEVELS.items()}


def _optional(message: Message, name: str, default: object) -> Any:
    """The optional field ``name`` of ``message``, ``default`` when unset (typed by the field, named at run time)."""
    return getattr(message, name) if message.HasField(name) else default


def sampling_from_proto(params: generation_pb2.SamplingParams, prompt_len: int, facts: ServerFacts) -> SamplingParams:
    """Resolve defaults and validate; raise InvalidRequestError naming the field."""
    sampling = SamplingParams(
        max_new_tokens=validation.resolve_max_new_tokens(
            _optional(params, "max_new_tokens", None), prompt_len, facts
        ),
        temperature=_optional(params, "temperature", 1.0),
        top_p=_optional(params, "top_p", 1.0),
        top_k=_optional(params, "top_k", -1),
        min_p=params.min_p,
        repetition_penalty=_optional(params, "repetition_penalty", 1.0),
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        seed=_optional(params, "seed", None),
        stop_token_ids=tuple(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        logprobs=params.logprobs or params.top_logprobs > 0,
        top_logprobs=params.top_logprobs,
        return_routed_experts=params.return_routed_experts,
    )
    validation.check_sampling(sampling, facts)
    return sampling


def structured_from_proto(request: generation_pb2.GenerateRequest) -> StructuredOutput | None:
    if not request.HasField("structured_output"):
        return None
    kind = request.structured_output.WhichOneof("constraint")
    if kind is None:
        raise InvalidRequestError(validation.STRUCTURED_EMPTY)
    spec = StructuredOutput(kind=kind, spec=getattr(request.structured_output, kind))
    validation.check_structured_output(spec)
    return spec


def prompt_from_proto(request: generation_pb2.GenerateRequest, facts: ServerFacts) -> PromptIds:
    """The request's prompt, from whichever of its two forms it came in, bounds-checked (vectorised)."""
    raw = request.prompt_ids_raw
    if not raw:
        # numpy copies the repeated field out in one call, far cheaper than Python's min/max over the container
        prompt = np.asarray(request.prompt_ids)
        validation.check_prompt(prompt, facts)
        return PromptIds.from_raw(prompt.astype("<i4").tobytes())
    validation.check_raw_prompt(raw, has_repeated=len(request.prompt_ids) > 0)
    validation.check_prompt(np.frombuffer(raw, dtype="<i4"), facts, "prompt_ids_raw")
    # kept as the bytes it came in: unpacking into Python ints costs CPU on every call, and most engines convert
    # to their own form anyway (tensors, lists)
    return PromptIds.from_raw(raw)


def media_from_proto(
    request: generation_pb2.GenerateRequest, prompt_len: int, facts: ServerFacts
) -> tuple[MediaInput, ...]:
    """The request's images, checked (``validation.check_media``: this decodes each one)."""
    media = tuple(MediaInput(item.mime_type, item.data, item.offset, item.length) for item in request.media)
    validation.check_media(media, prompt_len, facts)
    return media


def request_from_proto(request: generation_pb2.GenerateRequest, facts: ServerFacts) -> GenerateRequest:
    """Validate a GenerateRequest against the engine's limits and convert it (a request with images takes the
    time to decode them: see ``validation.check_media``)."""
    validation.check_request_id(request.request_id)
    prompt_ids = prompt_from_proto(request, facts)
    media = media_from_proto(request, len(prompt_ids), facts) if request.media else ()
    return GenerateRequest(
        request_id=request.request_id,
        session_id=request.session_id,
        prompt_ids=prompt_ids,
        sampling=sampling_from_proto(request.sampling_params, len(prompt_ids), facts),
        structured_output=structured_from_proto(request),
        priority=request.priority,
        media=media,
    )


def grouper_from_proto(request: generation_pb2.GenerateRequest) -> TokenGrouper | None:
    """The grouping the request's StreamOptions ask for; None when every token is sent as decoded."""
    if not request.HasField("stream_options"):
        return None
    options = request.stream_options
    if options.min_chunk_tokens < 0:
        raise InvalidRequestError(validation.MIN_CHUNK_TOKENS_INVALID.format(value=options.min_chunk_tokens))
    if not options.final_only and options.min_chunk_tokens <= 1:
        return None
    return TokenGrouper(options.min_chunk_tokens, options.final_only)


def fill_token_chunk(message: generation_pb2.TokenChunk, chunk: TokenChunk) -> None:
    """Write ``chunk`` into an empty message in place: a message built from keyword arguments is copied again
    when it is placed inside its parent."""
    message.token_ids.extend(chunk.token_ids)
    message.logprobs.extend(chunk.logprobs)
    for alternatives in chunk.top_logprobs:
        top = message.top_logprobs.add()
        top.token_ids.extend([token for token, _ in alternatives])
        top.logprobs.extend([logprob for _, logprob in alternatives])
    message.weight_version = chunk.weight_version
    if chunk.routed_experts:
        message.routed_experts = chunk.routed_experts


def fill_complete(
    message: generation_pb2.GenerateComplete, complete: GenerateComplete, tail: TokenChunk | None = None,
    load: LoadInfo | None = None,
) -> None:
    """Write ``complete`` into an empty message in place; ``tail`` holds the tokens not sent in a chunk
    (StreamOptions grouping, GenerateUnary); ``load``: the server's load now, as GetLoad would answer it."""
    message.finish_reason = FINISH_REASONS[complete.finish_reason]
    message.prompt_tokens = complete.prompt_tokens
    message.cached_prompt_tokens = complete.cached_prompt_tokens
    message.completion_tokens = complete.completion_tokens
    message.weight_version = complete.weight_version
    message.prompt_images = complete.prompt_images
    if complete.prompt_routed_experts:
        message.prompt_routed_experts = complete.prompt_routed_experts
    if tail is not None:
        fill_token_chunk(message.tokens, tail)
    if complete.matched_stop_token_id is not None:
        message.matched_stop_token_id = complete.matched_stop_token_id
    if load is not None:
        fill_load(message.load, load)


def chunk_to_proto(chunk: TokenChunk) -> generation_pb2.GenerateResponse:
    response = generation_pb2.GenerateResponse()
    fill_token_chunk(response.chunk, chunk)
    return response


def complete_to_proto(
    complete: GenerateComplete, tail: TokenChunk | None = None, load: LoadInfo | None = None
) -> generation_pb2.GenerateResponse:
    """The last message of a Generate stream."""
    response = generation_pb2.GenerateResponse()
    fill_complete(response.complete, complete, tail, load)
    return response


def info_to_proto(
    facts: ServerFacts | None, state: EngineState, weight_version: int
) -> engine_pb2.GetServerInfoResponse:
    """GetServerInfo: the engine's facts (none while it loads) and its state now."""
    facts_fields = dataclasses.asdict(facts) if facts is not None else {}  # named as the message's fields
    return engine_pb2.GetServerInfoResponse(state=ENGINE_STATES[state], weight_version=weight_version, **facts_fields)


def load_to_proto(load: LoadInfo) -> generation_pb2.GetLoadResponse:
    message = generation_pb2.GetLoadResponse()
    fill_load(message, load)
    return message


def fill_load(message: generation_pb2.GetLoadResponse, load: LoadInfo) -> None:
    """Write ``load`` in place: GetLoad's answer, and the copy every completion carries."""
    message.running_requests = load.running_requests
    message.waiting_requests = load.waiting_requests
    message.kv_cache_usage = load.kv_cache_usage
    message.prefix_cache_hit_rate = load.prefix_cache_hit_rate
    message.max_running_requests = load.max_running_requests
    message.preemptions = load.preemptions


def weight_group_from_proto(request: engine_pb2.JoinWeightGroupRequest) -> WeightGroupSpec:
    """JoinWeightGroup's spec (the lifecycle checks it against the engine's ranks)."""
    validation.check_weight_group_timeout(request.timeout_s, DEFAULT_TIMEOUT_S)
    return WeightGroupSpec(
        name=request.group_name,
        master_address=request.master_address,
        master_port=request.master_port,
        world_size=request.world_size,
        rank_offset=request.rank_offset,
        backend=request.backend,
        timeout_s=request.timeout_s or DEFAULT_TIMEOUT_S,
    )


def layout_from_proto(request: engine_pb2.ReceiveWeightsRequest) -> BucketLayout:
    """ReceiveWeights' announcement as the layout of the broadcast; InvalidRequestError naming the bad field."""
    if not request.group_name:
        raise InvalidRequestError("ReceiveWeights.group_name is required")
    if not request.tensors:
        raise InvalidRequestError("ReceiveWeights.tensors must name at least one tensor")
    if not MIN_BUCKET_BYTES <= request.bucket_bytes <= MAX_BUCKET_BYTES:
        raise InvalidRequestError(
            f"ReceiveWeights.bucket_bytes = {request.bucket_bytes} must be in [{MIN_BUCKET_BYTES}, {MAX_BUCKET_BYTES}]"
        )
    specs, names = [], set()
    for index, tensor in enumerate(request.tensors):
        field = f"ReceiveWeights.tensors[{index}]"
        if not tensor.name:
            raise InvalidRequestError(f"{field}.name is required")
        if tensor.name in names:
            raise InvalidRequestError(f"{field}.name {validation.quote(tensor.name)} is announced twice")
        if tensor.dtype not in wire_maps.DTYPES:
            raise InvalidRequestError(f"{field}.dtype is unspecified or unknown ({tensor.dtype})")
        if any(d < 0 for d in tensor.shape):
            raise InvalidRequestError(f"{field}.shape {list(tensor.shape)} has a negative dimension")
        names.add(tensor.name)
        specs.append(TensorSpec(tensor.name, wire_maps.DTYPES[tensor.dtype][0], tuple(tensor.shape)))
    return BucketLayout.of(specs, request.bucket_bytes)
