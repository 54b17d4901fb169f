"""A loop of a user's own, living outside the package as a user's module would: named by import path
(``tests.agent.custom_loops:ReviseLoop``) in a WorkerSpec or a rollout YAML, and built by every worker, in process
or in a Ray actor, as ``ReviseLoop(context, **kwargs)``. It uses only the pieces the built-in loops use."""

from __future__ import annotations

from agentloop_grpc.agent import LoopContext, Sample, Termination, Trajectory
from agentloop_grpc.agent.episode import BudgetExceeded, Episode
from agentloop_grpc.agent.generation import generate_turn
from agentloop_grpc.common.types import FinishReason

PATH = "tests.agent.custom_loops:ReviseLoop"


class ReviseLoop:
    """Answer; then hear ``follow_up`` as the user's reply and answer again, ``rounds`` times; at most
    ``max_new_tokens`` per answer. Those three are the loop's own config (the spec's kwargs)."""

    name = "revise"

    def __init__(self, context: LoopContext, follow_up: str, rounds: int = 1, max_new_tokens: int = 64) -> None:
        if rounds < 0 or max_new_tokens < 1:
            raise ValueError("rounds must be >= 0 and max_new_tokens >= 1")
        self.context = context
        self.follow_up = follow_up
        self.rounds = rounds
        self.max_new_tokens = max_new_tokens

    async def run(self, sample: Sample) -> Trajectory:
        episode = Episode(self.context, sample, self.name, tools=[])
        for answer in range(self.rounds + 1):
            turn = await generate_turn(self.context, episode.builder, answer,
                                       min(self.max_new_tokens, episode.budget_left))
            text = self.context.codec.assistant_text(turn.token_ids, turn.stopped_on)
            episode.model_turn(turn, text, {"role": "assistant", "content": text})
            if turn.finish_reason is FinishReason.LENGTH:
                return await episode.finish(Termination.LENGTH)
            if answer == self.rounds:
                break
            try:
                episode.continue_with([{"role": "user", "content": self.follow_up}], turn.stopped_on, "user")
            except BudgetExceeded:
                return await episode.finish(Termination.LENGTH)
            episode.builder.user_turns += 1
        return await episode.finish(Termination.STOP)


class NoRun:
    """Not a loop: it has no ``run`` (a spec naming it is refused when the worker is built)."""

    def __init__(self, context: LoopContext) -> None:
        self.context = context
