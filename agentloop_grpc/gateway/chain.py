"""Chain: one trajectory of a session, its token context kept exactly as our loops keep theirs.

A chain starts from a request's messages (the prompt, encoded as our loops encode a sample's) and grows by whole
turns: a request that appends to it adds its new messages as the chat template's delta after the last model turn
(``ChatCodec.delta``, the turn separator kept; mask 0), then the engine's tokens of the reply (mask 1, logprobs and
weight versions verbatim). Both go through the TrajectoryBuilder, the one place our loops append tokens, and only
once the turn is whole (``commit``): a turn that failed or whose client went away leaves the chain as it was.

``rendered`` is the template's view (assistant turns as the model's raw text) for the next delta and the drift
check; ``seen`` the conversation as the client should echo it back (``history.canonical``).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import Any

from agentloop_grpc.agent.builder import TrajectoryBuilder
from agentloop_grpc.agent.chat import ChatCodec, Encoded
from agentloop_grpc.agent.images import Picture, for_humans, read_images
from agentloop_grpc.agent.trajectory import Termination, Trajectory
from agentloop_grpc.common.media import ImageError, MediaInput

from .exchange import GatewayError
from .history import Canonical, canonical, template_view, tools_key
from .prompt_encoder import PromptEncoder
from .turn import TurnOutput

#: The loop name gateway trajectories carry.
LOOP = "gateway"


@dataclass(frozen=True, slots=True)
class PendingTurn:
    """A turn's input before it is committed: the delta of new messages (empty for a new chain's first turn)."""

    delta: Encoded
    rendered: list[dict[str, Any]]
    pictures: list[Picture]
    human: list[dict[str, Any]]
    messages: tuple[dict[str, Any], ...]

    def tokens(self) -> int:
        return len(self.delta.ids)


@dataclass(slots=True)
class Chain:
    index: int
    builder: TrajectoryBuilder
    tools: tuple[dict[str, Any], ...]
    tools_key: str
    rendered: list[dict[str, Any]]
    pictures: list[Picture]
    seen: list[Canonical] = field(default_factory=list)
    stopped_on: int | None = None
    open_for_assistant: bool = True
    busy: bool = False
    #: Why the chain can take no more turns (None: it can).
    ended: Termination | None = None
    error: str | None = None
    infrastructure_failure: bool = False
    infrastructure_cause: str | None = None
    last_finish: str = "stop"
    #: Turns whose calls a grammar forced (tool_choice required or a named function).
    forced_turns: int = 0
    #: The thinking mode its renders use (None: the template's default), fixed by its first request.
    thinking: bool | None = None

    @classmethod
    def start(cls, index: int, encoder: PromptEncoder, sample_id: str, group_id: str,
              messages: tuple[dict[str, Any], ...], tools: tuple[dict[str, Any], ...]) -> tuple[Chain, PendingTurn]:
        view = template_view(messages)
        try:
            rendered, pictures = read_images(view)
            prompt = encoder.prompt(rendered, list(tools), pictures)
        except ImageError as error:
            raise GatewayError(str(error), param="messages") from None
        builder = TrajectoryBuilder(sample_id, LOOP, prompt.ids, group_id=group_id, media=list(prompt.media))
        chain = cls(index, builder, tools, tools_key(tools), [], [])
        return chain, PendingTurn(Encoded([]), rendered, pictures, for_humans(view, 0), messages)

    def pending(self, codec: ChatCodec, messages: tuple[dict[str, Any], ...],
                new: tuple[dict[str, Any], ...]) -> PendingTurn:
        """The delta that appends ``new`` (the tail of ``messages``) after the last model turn."""
        view = template_view(new, messages[: len(messages) - len(new)])
        try:
            rendered, pictures = read_images(view)
            delta = codec.delta(self.rendered, rendered, list(self.tools), self.stopped_on, pictures)
        except ImageError as error:
            raise GatewayError(str(error), param="messages") from None
        return PendingTurn(delta, rendered, pictures, for_humans(view, len(self.pictures)), messages)

    def budget_left(self, limit: int) -> int:
        return limit - len(self.builder.response_ids)

    def turn_prompt(self, pending: PendingTurn) -> tuple[array, tuple[MediaInput, ...]]:
        """The turn's prompt (the context so far and the delta) and its pictures, spans in it."""
        ids = array("i")
        ids.frombytes(self.builder.context_ids.raw)
        offset = len(ids)
        ids.extend(pending.delta.ids)
        media = (*self.builder.media, *(m.moved(offset + m.offset) for m in pending.delta.media))
        return ids, media

    def commit(self, pending: PendingTurn, out: TurnOutput, reply: dict[str, Any], finish_reason: str,
               malformed_calls: int, forced: bool = False) -> None:
        """Record a whole turn: the delta (mask 0), the engine's tokens (mask 1), and the reply as sent."""
        builder = self.builder
        if pending.delta.ids:
            builder.context(pending.delta.ids, pending.delta.media)
            builder.user_turns += sum(m.get("role") == "user" for m in pending.messages[len(self.seen):])
        builder.model(out.token_ids, out.logprobs, out.weight_versions, out.routed_experts)
        builder.served_by(out.servers)
        builder.assistant_turns += 1
        self.forced_turns += forced
        builder.generate_s += out.seconds
        builder.resumed_generations += out.resumes
        builder.tool_calls += len(reply.get("tool_calls") or ())
        builder.malformed_tool_calls += malformed_calls
        builder.messages += [*pending.human, _for_record(reply)]
        self.rendered += [*pending.rendered, {"role": "assistant", "content": out.text}]
        self.pictures += pending.pictures
        self.seen = [*(canonical(m) for m in pending.messages), canonical(reply)]
        self.stopped_on = out.stopped_on
        self.open_for_assistant = False
        self.last_finish = finish_reason

    def fail(self, error: str, infrastructure: bool, cause: str | None = None) -> None:
        """End the chain failed; ``cause`` names what failed when the infrastructure did."""
        self.ended, self.error, self.infrastructure_failure = Termination.ERROR, error, infrastructure
        self.infrastructure_cause = (cause or "unspecified") if infrastructure else None

    def trajectory(self, codec: ChatCodec, reward: float, metrics: dict[str, float], drift_check: bool) -> Trajectory:
        termination = self.ended or (Termination.LENGTH if self.last_finish == "length" else Termination.STOP)
        drift = None
        if drift_check and termination is not Termination.ERROR and self.builder.assistant_turns:
            try:
                drift = codec.first_drift(self.rendered, list(self.tools), self.builder.context_ids,
                                          self.open_for_assistant, self.pictures)
            except ImageError:  # the model wrote an image placeholder: no render matches its ids
                drift = None
        failed = termination is Termination.ERROR
        # a logprob check replays the call grammar on every turn of a constrained trajectory: only a chain whose
        # every turn was forced is one (a forced turn's tokens the grammar alone allowed have logprob 0)
        self.builder.constrained = 0 < self.builder.assistant_turns == self.forced_turns
        metrics = {**metrics, "forced_turns": float(self.forced_turns)}
        return self.builder.build(termination, reward=0.0 if failed else reward, error=self.error,
                                  infrastructure_failure=self.infrastructure_failure,
                                  infrastructure_cause=self.infrastructure_cause, drift=drift,
                                  metrics={} if failed else metrics)


def _for_record(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as the trajectory's human-readable messages keep it (arguments parsed, as our loops keep them)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
    if reply.get("tool_calls"):
        message["tool_calls"] = [
            {**c, "function": {"name": c["function"]["name"], "arguments": _loads(c["function"]["arguments"])}}
            for c in reply["tool_calls"]
        ]
    return message


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
