"""SingleTurnLoop: one assistant turn on the sample's messages (no tools offered), then the reward."""

from __future__ import annotations

from agentloop_grpc.common.types import FinishReason

from ..context import LoopContext
from ..episode import Episode
from ..errors import INFRASTRUCTURE_ERRORS, REQUEST_ERRORS
from ..generation import generate_turn
from ..sample import Sample
from ..trajectory import Termination, Trajectory


class SingleTurnLoop:
    name = "single_turn"

    def __init__(self, context: LoopContext) -> None:
        self.context = context

    async def run(self, sample: Sample) -> Trajectory:
        episode = Episode(self.context, sample, self.name, tools=[])
        try:
            budget = min(self.context.config.max_new_tokens_per_turn, episode.budget_left)
            turn = await generate_turn(self.context, episode.builder, 0, budget, sampling=sample.sampling)
        except INFRASTRUCTURE_ERRORS as error:
            return await episode.finish(Termination.ERROR, error=str(error), infrastructure_failure=True,
                                        infrastructure_cause=error.cause)
        except REQUEST_ERRORS as error:
            return await episode.finish(Termination.ERROR, error=str(error))
        text = self.context.codec.assistant_text(turn.token_ids, turn.stopped_on)
        episode.model_turn(turn, text, {"role": "assistant", "content": text})
        termination = Termination.LENGTH if turn.finish_reason is FinishReason.LENGTH else Termination.STOP
        return await episode.finish(termination)
