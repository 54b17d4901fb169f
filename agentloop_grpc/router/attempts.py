"""The pieces of a generate call's attempts that need no Router: each attempt's request, whether tokens received
before a failure already end the generation, and the tokens received so far."""

from __future__ import annotations

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import FinishReason, SamplingParams
from agentloop_grpc.v1 import generation_pb2

from .call import GenerateCall


class Received:
    """Every attempt's tokens, in order, with aligned logprobs, alternatives and weight versions."""

    __slots__ = ("logprobs", "token_ids", "top_logprobs", "weight_versions")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[tuple[tuple[int, float], ...]] = []
        self.weight_versions: list[int] = []

    def add(self, chunk: generation_pb2.TokenChunk) -> None:
        ids = chunk.token_ids
        self.token_ids.extend(ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.top_logprobs:
            self.top_logprobs.extend(tuple(zip(alt.token_ids, alt.logprobs, strict=True)) for alt in chunk.top_logprobs)
        self.weight_versions.extend([chunk.weight_version] * len(ids))


def attempt_request(
    request_id: str,
    call: GenerateCall,
    prompt: bytes,
    received: list[int],
    stream_options: generation_pb2.StreamOptions | None,
    into: generation_pb2.GenerateRequest,
    default_budget: int = 0,
) -> None:
    """Fill ``into`` (an empty request, or a GenerateUnaryRequest's, which spares copying a whole request into its
    wrapper) with one attempt: the prompt (int32 bytes) extended by the tokens received, its images, and the budget
    left. ``default_budget``: the server's default_max_new_tokens (0: none), which a call without sampling spends
    once over all its attempts."""
    into.request_id = request_id
    into.session_id = call.session_id
    into.prompt_ids_raw = prompt + wire.prompt_to_raw(received) if received else prompt
    if call.sampling is None:
        into.sampling_params.SetInParent()  # the server's defaults
        if received and default_budget > 0:  # a fresh default on resume would generate up to twice as much
            into.sampling_params.max_new_tokens = default_budget - len(received)
    else:
        wire.fill_sampling(into.sampling_params, call.sampling, call.sampling.max_new_tokens - len(received))
    if call.structured_output is not None:
        wire.fill_structured_output(into.structured_output, call.structured_output)
    into.priority = call.priority
    for item in call.media:  # every attempt: the received tokens follow the prompt, so the spans stay put
        into.media.add(mime_type=item.mime_type, data=item.data, offset=item.offset, length=item.length)
    if stream_options is not None:
        into.stream_options.CopyFrom(stream_options)


def ended_before_resume(
    tokens: list[int], sampling: SamplingParams | None, eos_token_ids: tuple[int, ...] | None,
    default_budget: int = 0,
) -> tuple[FinishReason, int | None] | None:
    """Whether the tokens received before a failure already end the generation (budget spent, stop token).
    ``eos_token_ids`` and ``default_budget`` (its default_max_new_tokens, for a call without sampling): those of the
    server about to resume it, if known."""
    if not tokens:
        return None
    if sampling is not None and tokens[-1] in sampling.stop_token_ids:
        return FinishReason.STOP, tokens[-1]
    ignore_eos = sampling is not None and sampling.ignore_eos
    if not ignore_eos and tokens[-1] in (eos_token_ids or ()):
        return FinishReason.STOP, tokens[-1]
    budget = sampling.max_new_tokens if sampling is not None else default_budget
    if budget > 0 and len(tokens) >= budget:
        return FinishReason.LENGTH, None
    return None
