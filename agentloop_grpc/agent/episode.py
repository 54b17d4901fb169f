"""Episode: the conversation state one loop run shares between its turns, and how it ends.

It keeps two views of the conversation: ``rendered`` (what the chat template renders: assistant turns as the model's
raw text, so a fresh render reproduces its text where the template keeps it) and the builder's ``messages`` (for
humans: assistant turns with parsed tool calls). It encodes every non-model turn as a template delta (pictures
expanded, their spans recorded), enforces the response budget, traces turns, and at the end runs the drift check (a
departure from a fresh render is recorded, classified, in the trajectory; only the strict mode fails it) and the
reward.
"""

from __future__ import annotations

import time
from typing import Any

from agentloop_grpc.common.media import ImageError

from .builder import TrajectoryBuilder
from .context import LoopContext
from .errors import LoopError
from .generation import Turn
from .images import for_humans, read_images
from .reward import Outcome, score
from .sample import Sample
from .trajectory import Phase, Termination, Trajectory


class BudgetExceeded(Exception):
    """The next turn does not fit in the response budget."""


class Episode:
    def __init__(self, context: LoopContext, sample: Sample, loop: str, tools: list[dict[str, Any]]) -> None:
        self.context = context
        self.sample = sample
        self.tools = tools  # OpenAI specs offered to the model
        try:
            self.rendered, self.pictures = read_images(sample.messages)
            prompt = context.codec.prompt(self.rendered, tools, self.pictures)
        except ImageError as error:  # this sample fails; the others go on
            raise LoopError(f"sample {sample.sample_id}: {error}") from None
        if len(prompt.ids) > context.config.max_prompt_tokens:
            raise LoopError(f"the prompt has {len(prompt.ids)} tokens, "
                            f"more than max_prompt_tokens={context.config.max_prompt_tokens}")
        self.builder = TrajectoryBuilder(sample.sample_id, loop, prompt.ids, group_id=sample.group_id,
                                         media=list(prompt.media))
        self.builder.messages = for_humans(sample.messages, 0)
        self.open_for_assistant = True

    @property
    def budget_left(self) -> int:
        return self.context.config.response_budget - len(self.builder.response_ids)

    def model_turn(self, turn: Turn, text: str, human: dict[str, Any]) -> None:
        """Record a finished model turn (its tokens are already in the builder)."""
        self.builder.assistant_turns += 1
        self.builder.generate_s += turn.seconds
        self.builder.phases.append(Phase("assistant", len(turn.token_ids), turn.seconds))
        self.rendered.append({"role": "assistant", "content": text})
        self.builder.messages.append(human)
        self.open_for_assistant = False
        self.trace("assistant", list(turn.token_ids), text, turn.seconds, server=turn.server,
                   tool_calls=human.get("tool_calls", []), finish_reason=turn.finish_reason.value)

    def continue_with(
        self, new_messages: list[dict[str, Any]], stopped_on: int | None, kind: str, seconds: float = 0.0
    ) -> None:
        """Append non-model messages as the template's delta (mask 0, pictures expanded and kept);
        BudgetExceeded if they do not fit. ``seconds``: how long producing them took (tools, interaction), for the
        trace."""
        try:
            rendered, pictures = read_images(new_messages, f"the {kind} turn's messages")
            delta = self.context.codec.delta(self.rendered, rendered, self.tools, stopped_on, pictures)
        except ImageError as error:
            raise LoopError(str(error)) from None
        if len(delta.ids) >= self.budget_left:  # at least one model token must fit after it
            raise BudgetExceeded(f"a {kind} turn of {len(delta.ids)} tokens does not fit in {self.budget_left} left")
        self.builder.context(delta.ids, delta.media)
        self.builder.phases.append(Phase(kind, len(delta.ids), seconds))
        self.rendered += rendered
        self.builder.messages += for_humans(new_messages, len(self.pictures))
        self.pictures += pictures
        self.open_for_assistant = True
        self.trace(kind, delta.ids, _text(new_messages), seconds)

    def trace_unappended(self, kind: str, messages: list[dict[str, Any]], seconds: float) -> None:
        """Trace a phase whose messages end the episode instead of entering the context (no token ids)."""
        self.builder.phases.append(Phase(kind, 0, seconds))
        self.trace(kind, [], _text(messages), seconds, appended=False)

    def trace(self, kind: str, token_ids: list[int], text: str, seconds: float, **extra: Any) -> None:
        if self.context.tracer is None:
            return
        self.context.tracer.record({
            "sample_id": self.sample.sample_id,
            "turn": self.builder.assistant_turns,
            "kind": kind,
            "time": time.time(),
            "seconds": seconds,
            "token_ids": token_ids,
            "text": text,
            **extra,
        })

    async def finish(
        self,
        termination: Termination,
        tool_instance_rewards: dict[str, float] | None = None,
        interaction_score: float | None = None,
        error: str | None = None,
        infrastructure_failure: bool = False,
        infrastructure_cause: str | None = None,
    ) -> Trajectory:
        """Drift check, reward (not for failed trajectories), then the frozen Trajectory."""
        self.context.generator.close_session(self.builder.sample_id)  # no more turns: the Router may forget it
        drift = None
        if self.context.config.drift_check != "off" and termination is not Termination.ERROR:
            try:
                drift = self.context.codec.first_drift(
                    self.rendered, self.tools, self.builder.context_ids, self.open_for_assistant, self.pictures
                )
            except ImageError as image_error:  # the model wrote an image placeholder: no render matches the ids
                termination, error = Termination.ERROR, f"drift check: {image_error}"
            if drift is not None and self.context.config.drift_check == "strict":
                termination, error = (Termination.ERROR,
                                      f"{drift.kind} drift at token {drift.position} (strict check): recorded "
                                      f"{drift.recorded_text!r}, rendered {drift.rendered_text!r}")
        reward, metrics, reward_s = 0.0, {}, 0.0
        if termination is not Termination.ERROR:
            started = time.monotonic()
            result = await score(
                self.context.reward,
                Outcome(
                    sample=self.sample,
                    messages=tuple(self.builder.messages),
                    termination=termination,
                    tool_instance_rewards=dict(tool_instance_rewards or {}),
                    tool_step_rewards=tuple(self.builder.tool_rewards),
                    interaction_score=interaction_score,
                    response_ids=tuple(self.builder.response_ids),
                ),
            )
            reward, metrics, reward_s = result.reward, result.metrics, time.monotonic() - started
        self.trace("end", [], termination.value, 0.0, reward=reward, error=error)
        return self.builder.build(
            termination,
            reward=reward,
            reward_s=reward_s,
            error=error,
            infrastructure_failure=infrastructure_failure,
            infrastructure_cause=infrastructure_cause,
            drift=drift,
            metrics=metrics,
        )


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(_content_text(m.get("content", "")) for m in messages)


def _content_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" if p.get("type") == "text" else "[image]" for p in content)
