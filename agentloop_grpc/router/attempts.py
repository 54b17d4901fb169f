"""The pieces of a generate call's attempts that need no Router: the call's progress over its attempts, each
attempt's request, and whether tokens received before a failure already end the generation.

An attempt after tokens were received (a failover, or the resume of an ABORT) continues them, with one rule for
both, the only one anywhere (agent loops and the gateway call the Router with ``max_resumes``): the prompt is the
call's with the tokens so far appended, the budget what is left, no grammar (the contract carries no matcher state,
so a grammar sent again would start over mid-way; a broken call is then the model's, counted as such), and, for
the Nth resume of an ABORT, the seed ``resume_seed(seed, N)``: seeded runs repeat and no two generations of a turn
share a random stream. A failover keeps its seed (the lost attempt's stream was never seen whole)."""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable

from agentloop_grpc.common import routed_experts, wire
from agentloop_grpc.common.routed_experts import TurnRouting
from agentloop_grpc.common.types import FinishReason, SamplingParams
from agentloop_grpc.v1 import generation_pb2

from .call import GenerateCall
from .errors import InfrastructureError
from .result import GenerateResult


class CallProgress:
    """One generate call over its attempts: its ids and deadline, every attempt's tokens in order (with aligned
    logprobs, alternatives, weight versions and, when asked, routed experts), the servers that served it and those
    that just failed it."""

    __slots__ = (
        "_first_token",
        "base_id",
        "call",
        "deadline",
        "failed",
        "failovers",
        "failures",
        "logprobs",
        "prompt",
        "prompt_routing",
        "resumes",
        "routing",
        "routing_shape",
        "servers",
        "started",
        "token_ids",
        "top_logprobs",
        "weight_versions",
    )

    def __init__(
        self, call: GenerateCall, base_id: str, timeout_s: float, first_token: Callable[[float], None]
    ) -> None:
        self.call = call
        self.base_id = base_id
        self.prompt = wire.prompt_to_raw(call.prompt_ids)
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[tuple[tuple[int, float], ...]] = []
        self.weight_versions: list[int] = []
        #: Each token's routed experts, in token order over the attempts (None: not asked).
        self.routing: bytearray | None = bytearray() if call.sampling and call.sampling.return_routed_experts else None
        #: The call's prompt positions 0 .. P - 2, from the first attempt that reported its prompt's.
        self.prompt_routing = b""
        #: (layers, top-k, experts) of the servers that served the call (their GetServerInfo).
        self.routing_shape: tuple[int, int, int] | None = None
        self.servers: list[str] = []
        self.failed: set[str] = set()
        self.failovers = 0
        #: Attempts that failed (retried up to RouterConfig.max_attempts) and ABORTs resumed (up to max_resumes).
        self.failures = 0
        self.resumes = 0
        self._first_token: Callable[[float], None] | None = first_token  # observed once, then None

    def attempt_id(self, attempt: int) -> str:
        """The request id of attempt ``attempt`` (from 1): a resumed attempt's differs, so an Abort of the lost
        one cannot end it."""
        return self.base_id if attempt == 1 else f"{self.base_id}.{attempt}"

    def left_s(self) -> float:
        """Seconds left before the deadline (a sliver at least: gRPC takes no zero timeout)."""
        return max(0.001, self.deadline - time.monotonic())

    def add(self, chunk: generation_pb2.TokenChunk) -> None:
        """Add a received message's tokens (every attempt's, in order)."""
        ids = chunk.token_ids
        self.token_ids.extend(ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.top_logprobs:
            self.top_logprobs.extend(tuple(zip(alt.token_ids, alt.logprobs, strict=True)) for alt in chunk.top_logprobs)
        self.weight_versions.extend([chunk.weight_version] * len(ids))
        if self.routing is not None:
            self.routing += chunk.routed_experts
        if self._first_token is not None and self.token_ids:
            self._first_token(time.monotonic() - self.started)
            self._first_token = None

    def routed_on(self, layers: int, per_token: int, num_experts: int) -> None:
        """An attempt of a call that asked for routing runs on a server that reports routing of this shape."""
        self.routing_shape = (layers, per_token, num_experts)

    def prompt_routed(self, prompt_routing: bytes) -> None:
        """An attempt completed reporting its prompt's routing: the first one's positions of the call's own prompt
        are kept (a resumed attempt's prompt also holds the tokens received, which carry their own)."""
        if self.prompt_routing or not prompt_routing or self.routing_shape is None:
            return
        wanted = max(len(self.prompt) // 4 - 1, 0) * routed_experts.wire_bytes(1, *self.routing_shape)
        if len(prompt_routing) >= wanted:
            self.prompt_routing = prompt_routing[:wanted]

    def _turn_routing(self) -> TurnRouting | None:
        if self.routing is None or self.routing_shape is None:
            return None
        layers, per_token, num_experts = self.routing_shape
        routing = TurnRouting(layers, per_token, num_experts, self.prompt_routing, bytes(self.routing))
        if len(routing.tokens) != len(self.token_ids) * routing.row_bytes:
            raise InfrastructureError(
                f"generate {self.base_id}: {len(routing.tokens)} bytes of routed experts for {len(self.token_ids)} "
                f"tokens of {routing.row_bytes} bytes each (the engine broke the contract)")
        return routing

    def result(
        self, finish_reason: FinishReason, matched: int | None, cached: int, images: int, seconds: float
    ) -> GenerateResult:
        return GenerateResult(
            request_id=self.base_id,
            session_id=self.call.session_id,
            token_ids=tuple(self.token_ids),
            logprobs=tuple(self.logprobs),
            top_logprobs=tuple(self.top_logprobs),
            weight_versions=tuple(self.weight_versions),
            finish_reason=finish_reason,
            matched_stop_token_id=matched,
            prompt_tokens=len(self.prompt) // 4,
            cached_prompt_tokens=cached,
            servers=tuple(self.servers),
            failovers=self.failovers,
            seconds=seconds,
            prompt_images=images,
            resumes=self.resumes,
            routed_experts=self._turn_routing(),
        )


def resume_seed(seed: int | None, resume: int) -> int | None:
    """The seed of a call's ``resume``-th resumed ABORT (0: the call's own)."""
    if seed is None or resume == 0:
        return seed
    return (seed + zlib.crc32(f"resume/{resume}".encode())) % 2**64


def attempt_request(
    request_id: str,
    call: GenerateCall,
    prompt: bytes,
    received: list[int],
    stream_options: generation_pb2.StreamOptions | None,
    into: generation_pb2.GenerateRequest,
    default_budget: int = 0,
    resume: int = 0,
) -> None:
    """Fill ``into`` (an empty request, or a GenerateUnaryRequest's, which spares copying a whole request into its
    wrapper) with one attempt: the prompt (int32 bytes) extended by the tokens received, its images, and the budget
    left. ``default_budget``: the server's default_max_new_tokens (0: none), which a call without sampling spends
    once over all its attempts; ``resume``: how many ABORTs the call resumed so far (the module docstring's
    rule)."""
    into.request_id = request_id
    into.session_id = call.session_id
    into.prompt_ids_raw = prompt + wire.prompt_to_raw(received) if received else prompt
    if call.sampling is None:
        into.sampling_params.SetInParent()  # the server's defaults
        if received and default_budget > 0:  # a fresh default on resume would generate up to twice as much
            into.sampling_params.max_new_tokens = default_budget - len(received)
    else:
        sampling = call.sampling
        if resume and sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=resume_seed(sampling.seed, resume))
        wire.fill_sampling(into.sampling_params, sampling, sampling.max_new_tokens - len(received))
    if call.structured_output is not None and not received:
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
