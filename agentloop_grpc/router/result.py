"""GenerateResult: one generation as the caller sees it, however many servers produced it."""

from __future__ import annotations

from dataclasses import dataclass

from agentloop_grpc.common.routed_experts import TurnRouting
from agentloop_grpc.common.types import FinishReason


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """Token ids exactly as the engines produced them, with aligned logprobs and weight versions.

    After a failover the tokens of every attempt are concatenated in order; nothing is lost or duplicated, because
    each new attempt's prompt is the original prompt plus the tokens already received, and its budget is what was
    left.
    """

    request_id: str
    session_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    #: Weight version of each token in ``token_ids``.
    weight_versions: tuple[int, ...]
    finish_reason: FinishReason
    matched_stop_token_id: int | None
    prompt_tokens: int
    #: Prompt tokens the last attempt's server served from its prefix cache (a failed attempt reports none).
    cached_prompt_tokens: int
    #: Servers in the order they served this generation (more than one after a failover).
    servers: tuple[str, ...]
    failovers: int
    seconds: float
    #: Images the engine read for the prompt (GenerateCall.media), as the last attempt's server reported.
    prompt_images: int = 0
    #: Times an ABORT finish was resumed (GenerateCall.max_resumes).
    resumes: int = 0
    #: The experts the prompt and each token were routed to, when the call asked (``return_routed_experts``).
    routed_experts: TurnRouting | None = None
