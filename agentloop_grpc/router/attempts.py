"""The pieces of a generate call's attempts that need no Router: each attempt's request, whether tokens received
before a failure already end the generation, and the tokens received so far."""

from __future__ import annotations

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import FinishReason, TokenChunk
from agentloop_grpc.v1 import generation_pb2

from .endpoint import Endpoint
from .prompts import WirePrompt


class Received:
    """Every attempt's tokens, in order, with aligned logprobs, alternatives and weight versions."""

    __slots__ = ("token_ids", "logprobs", "top_logprobs", "weight_versions")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[tuple[tuple[int, float], ...]] = []
        self.weight_versions: list[int] = []

    def add(self, chunk: TokenChunk) -> None:
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        self.top_logprobs.extend(chunk.top_logprobs)
        self.weight_versions.extend([chunk.weight_version] * len(chunk.token_ids))

    def add_proto(self, chunk: generation_pb2.TokenChunk) -> None:
        """A received message's tokens, without the TokenChunk that only a streaming caller sees."""
        ids = chunk.token_ids
        self.token_ids.extend(ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.top_logprobs:
            self.top_logprobs.extend(tuple(zip(alt.token_ids, alt.logprobs, strict=True)) for alt in chunk.top_logprobs)
        self.weight_versions.extend([chunk.weight_version] * len(ids))


def attempt_request(
    request_id: str,
    session_id: str,
    prompt: WirePrompt | list[int],
    params: generation_pb2.SamplingParams,
    received: int,
    structured_output: generation_pb2.StructuredOutput | None,
    priority: int,
    stream_options: generation_pb2.StreamOptions | None,
    into: generation_pb2.GenerateRequest | None = None,
) -> generation_pb2.GenerateRequest:
    """The request of one attempt: the prompt (int32 bytes, or ids) extended by what was received, with the budget
    that is left. ``into``: an empty request to fill (a GenerateUnaryRequest's), which spares copying a whole
    request into its wrapper."""
    request = generation_pb2.GenerateRequest() if into is None else into
    request.request_id = request_id
    request.session_id = session_id
    raw = prompt if isinstance(prompt, bytes) else wire.prompt_to_raw(prompt)
    if raw is None:
        request.prompt_ids.extend(prompt)  # ids outside int32: refused here (ValueError)
    else:
        request.prompt_ids_raw = raw
    request.sampling_params.CopyFrom(params)  # a copy: the caller's message is never modified
    if received and params.HasField("max_new_tokens"):
        request.sampling_params.max_new_tokens = params.max_new_tokens - received
    if structured_output is not None:
        request.structured_output.CopyFrom(structured_output)
    request.priority = priority
    if stream_options is not None:
        request.stream_options.CopyFrom(stream_options)
    return request


def ended_before_resume(
    tokens: list[int], params: generation_pb2.SamplingParams, endpoint: Endpoint
) -> tuple[FinishReason, int | None] | None:
    """Whether the tokens received before a failure already end the generation (budget spent, stop token)."""
    if not tokens:
        return None
    if tokens[-1] in params.stop_token_ids:
        return FinishReason.STOP, tokens[-1]
    eos = endpoint.info.eos_token_ids if endpoint.info is not None else ()
    if not params.ignore_eos and tokens[-1] in eos:
        return FinishReason.STOP, tokens[-1]
    if params.HasField("max_new_tokens") and len(tokens) >= params.max_new_tokens:
        return FinishReason.LENGTH, None
    return None
