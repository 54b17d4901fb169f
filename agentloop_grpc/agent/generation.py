"""One assistant turn: generate through the router, append the engine's tokens verbatim.

Partial rollout: when the trainer pauses the engines with ABORT to update weights, the in-flight generation ends
with FINISH_REASON_ABORT and the tokens decoded so far; the Router resumes it (``GenerateCall.max_resumes``: the
loop's ``max_resumes`` when ``resume_on_abort``, else none) with the tokens so far as prompt and what is left of the
budget, the engine holding the new request until ``resume``. Each token keeps the weight version that produced it,
so a trajectory spanning an update says so. What a resumed attempt's seed and grammar are is the Router's one rule
(router/attempts.py): a constrained turn resumed mid-way continues unconstrained. With ``return_routed_experts`` the
turn also asks for the experts a MoE model routed each position to; the builder records them (builder.py).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from agentloop_grpc.common.types import FinishReason, StructuredOutput
from agentloop_grpc.router.call import GenerateCall

from .builder import TrajectoryBuilder
from .config import SamplingConfig
from .context import LoopContext
from .errors import LoopError


@dataclass(frozen=True, slots=True)
class Turn:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    #: The stop token that ended the turn (None when it ended on length).
    stopped_on: int | None
    seconds: float
    server: str


def seed_offset(sample_id: str, turn: int) -> int:
    """A stable per-(sample, turn) offset, so seeded runs repeat and no two turns share a stream (a resumed one's
    the Router derives: router/attempts.py)."""
    return zlib.crc32(f"{sample_id}/{turn}/0".encode())


async def generate_turn(
    context: LoopContext,
    builder: TrajectoryBuilder,
    turn: int,
    max_new_tokens: int,
    structured_output: StructuredOutput | None = None,
    sampling: SamplingConfig | None = None,
) -> Turn:
    """``sampling``: the sample's own (Sample.sampling), which replaces the config's for this turn."""
    config = context.config
    sampling = config.sampling_for(turn) if sampling is None else sampling
    result = await context.generator.generate(
        GenerateCall(
            session_id=builder.sample_id,
            prompt_ids=builder.context_ids,
            sampling=sampling.params(
                max_new_tokens, seed_offset(builder.sample_id, turn), routed_experts=config.return_routed_experts),
            structured_output=structured_output,
            timeout_s=config.generate_timeout_s,
            media=tuple(builder.media),  # every picture so far: all their spans lie in this prompt
            group_id=builder.group_id,
            max_resumes=config.max_resumes if config.resume_on_abort else 0,
        )
    )
    builder.model(result.token_ids, result.logprobs, result.weight_versions, result.routed_experts)
    builder.served_by(result.servers)
    builder.resumed_generations += result.resumes
    server = result.servers[-1] if result.servers else ""
    if result.finish_reason is FinishReason.ABORT:
        if not config.resume_on_abort:
            raise LoopError("the engine aborted the generation (resume_on_abort is off)")
        raise LoopError(f"the engine aborted one generation more than max_resumes={config.max_resumes} times")
    stopped_on = result.matched_stop_token_id if result.finish_reason is FinishReason.STOP else None
    return Turn(tuple(result.token_ids), result.finish_reason, stopped_on, result.seconds, server)
