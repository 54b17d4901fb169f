"""One assistant turn: generate through the router, append the engine's tokens verbatim, resume after aborts.

Partial rollout: when the trainer pauses the engines with ABORT to update weights, the in-flight generation ends
with FINISH_REASON_ABORT and the tokens decoded so far. They are kept (already appended), and the turn goes on
with a new request whose prompt is everything so far and whose budget is what is left; the engine holds it until
``resume``. Each token keeps the weight version that produced it, so a trajectory spanning an update says so.

Limitation: a grammar constraint cannot be resumed mid-way (the contract carries no matcher state), so a
constrained turn that is resumed continues unconstrained; a broken call then becomes a counted tool error.
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


def seed_offset(sample_id: str, turn: int, attempt: int) -> int:
    """A stable per-(sample, turn, resume) offset, so seeded runs repeat and no two generations share a stream."""
    return zlib.crc32(f"{sample_id}/{turn}/{attempt}".encode())


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
    produced: list[int] = []
    seconds = 0.0
    server = ""
    for attempt in range(config.max_resumes + 1):
        result = await context.generator.generate(
            GenerateCall(
                session_id=builder.sample_id,
                prompt_ids=builder.context_ids,
                sampling=sampling.params(max_new_tokens - len(produced), seed_offset(builder.sample_id, turn, attempt)),
                structured_output=structured_output if not produced else None,
                timeout_s=config.generate_timeout_s,
                media=tuple(builder.media),  # every picture so far: all their spans lie in this prompt
                group_id=builder.group_id,
            )
        )
        builder.model(result.token_ids, result.logprobs, result.weight_versions)
        builder.served_by(result.servers)
        produced += result.token_ids
        seconds += result.seconds
        server = result.servers[-1] if result.servers else server
        if result.finish_reason is not FinishReason.ABORT:
            stopped_on = result.matched_stop_token_id if result.finish_reason is FinishReason.STOP else None
            return Turn(tuple(produced), result.finish_reason, stopped_on, seconds, server)
        if not config.resume_on_abort:
            raise LoopError("the engine aborted the generation (resume_on_abort is off)")
        if len(produced) >= max_new_tokens:
            return Turn(tuple(produced), FinishReason.LENGTH, None, seconds, server)
        builder.resumed_generations += 1
    raise LoopError(f"the engine aborted one generation more than max_resumes={config.max_resumes} times")
