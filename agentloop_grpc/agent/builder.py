"""TrajectoryBuilder: the mutable record a loop appends to while it runs, frozen into a Trajectory at the end.

Two kinds of appends and nothing else: ``model`` (the engine's tokens, logprobs and weight versions, verbatim) and
``context`` (tokens the loop encoded: tool responses, user turns, turn separators; mask 0). Keeping the kinds apart
is what makes the mask right by construction.

Both also extend an append-only int32 array of the whole context (prompt and response so far), which is each
turn's prompt as it goes on the wire: its bytes, copied, never packed again id by id. ``media`` holds the
pictures of that context with their spans in it (each turn's GenerateCall carries them all).

Routed experts (a MoE model's routing, when the loop asks): one row per input position of the context from 0,
kept as each generation reported it. A generation's tokens bring their own rows; the positions before its first
token that no earlier generation covered (the tool or user tokens appended since, and the last token of the turn
before) come from its prompt's routing. Where a generation reports none for positions still uncovered, the record
stops there: what follows is unknown rather than misaligned.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentloop_grpc.common import wire
from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.common.routed_experts import Routing, TurnRouting

from .trajectory import Drift, Phase, Termination, Timings, ToolCallMetrics, Trajectory


@dataclass(slots=True)
class TrajectoryBuilder:
    sample_id: str
    loop: str
    prompt_ids: list[int]
    group_id: str = ""
    #: The pictures of prompt + response so far, their spans as offsets in it.
    media: list[MediaInput] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_tool_calls: int = 0
    resumed_generations: int = 0
    servers: list[str] = field(default_factory=list)
    tool_call_metrics: list[ToolCallMetrics] = field(default_factory=list)
    constrained: bool = False
    phases: list[Phase] = field(default_factory=list)
    generate_s: float = 0.0
    tools_s: float = 0.0
    interaction_s: float = 0.0
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    _context: array = field(init=False, repr=False)
    #: (layers, top-k, experts) of the routing recorded; None until a generation reports some.
    _routing_shape: tuple[int, int, int] | None = field(default=None, init=False, repr=False)
    #: Routed experts of context positions 0.. (see the module docstring).
    _routing_rows: bytearray = field(default_factory=bytearray, init=False, repr=False)
    #: A generation left positions without routing: the record ends at them.
    _routing_stopped: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._context = array("i", self.prompt_ids)

    @property
    def context_ids(self) -> PromptIds:
        """Prompt plus response so far, as int32 bytes: the next generation's prompt."""
        return PromptIds.from_raw(wire.prompt_to_raw(self._context))

    def model(
        self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int],
        routing: TurnRouting | None = None,
    ) -> None:
        """Append tokens the engine produced, exactly as produced; ``routing``: their generation's routed experts,
        when asked for."""
        if not (len(token_ids) == len(versions) and len(logprobs) in (0, len(token_ids))):
            raise ValueError(
                f"engine output is misaligned: {len(token_ids)} tokens, {len(logprobs)} logprobs, "
                f"{len(versions)} versions"
            )
        if routing is not None and len(routing.tokens) != len(token_ids) * routing.row_bytes:
            raise ValueError(f"engine output is misaligned: {len(token_ids)} tokens, "
                             f"{len(routing.tokens) // routing.row_bytes} rows of routed experts")
        self._route(routing, len(token_ids))
        self.response_ids += token_ids
        self._context.extend(token_ids)
        self.response_mask += [1] * len(token_ids)
        self.response_logprobs += logprobs if logprobs else [0.0] * len(token_ids)
        self.weight_versions += versions

    def _route(self, routing: TurnRouting | None, tokens: int) -> None:
        """Extend the routing record by a generation of ``tokens`` tokens whose prompt is the context so far."""
        if self._routing_stopped or (routing is None and self._routing_shape is None):
            return
        shape = None if routing is None else (routing.layers, routing.per_token, routing.num_experts)
        if routing is None or (self._routing_shape is not None and shape != self._routing_shape):
            self._routing_stopped = True  # a generation without routing (or of another model): unknown from here
            return
        self._routing_shape = shape
        row = routing.row_bytes
        covered = len(self._routing_rows) // row
        wanted = len(self._context) - 1  # the prompt's positions before the one that sampled the first token
        if covered < wanted:
            if len(routing.prompt) < wanted * row:
                self._routing_stopped = True
                return
            self._routing_rows += routing.prompt[covered * row : wanted * row]
        self._routing_rows += routing.tokens

    @property
    def routed_experts(self) -> Routing | None:
        """The routed experts of context positions 0.. recorded so far (None: none asked for or reported)."""
        if self._routing_shape is None:
            return None
        return Routing(*self._routing_shape, bytes(self._routing_rows))

    def context(self, token_ids: Sequence[int], media: Sequence[MediaInput] = ()) -> None:
        """Append tokens the loop encoded (tool/user turns, template separators): not trained on. ``media``: the
        pictures among them, spans relative to ``token_ids``."""
        self.media += [m.moved(len(self._context) + m.offset) for m in media]
        self.response_ids += token_ids
        self._context.extend(token_ids)
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)
        self.weight_versions += [-1] * len(token_ids)

    def served_by(self, servers: Sequence[str]) -> None:
        for server in servers:
            if server not in self.servers:
                self.servers.append(server)

    def build(
        self,
        termination: Termination,
        reward: float = 0.0,
        reward_s: float = 0.0,
        error: str | None = None,
        infrastructure_failure: bool = False,
        infrastructure_cause: str | None = None,
        drift: Drift | None = None,
        metrics: dict[str, float] | None = None,
    ) -> Trajectory:
        return Trajectory(
            sample_id=self.sample_id,
            loop=self.loop,
            group_id=self.group_id,
            prompt_ids=tuple(self.prompt_ids),
            media=tuple(self.media),
            response_ids=tuple(self.response_ids),
            response_mask=tuple(self.response_mask),
            response_logprobs=tuple(self.response_logprobs),
            weight_versions=tuple(self.weight_versions),
            reward=reward,
            termination=termination,
            assistant_turns=self.assistant_turns,
            user_turns=self.user_turns,
            turn_scores=tuple(self.turn_scores),
            tool_rewards=tuple(self.tool_rewards),
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            malformed_tool_calls=self.malformed_tool_calls,
            constrained=self.constrained,
            infrastructure_failure=infrastructure_failure,
            infrastructure_cause=infrastructure_cause,
            error=error,
            drift=drift,
            resumed_generations=self.resumed_generations,
            timings=Timings(
                generate_s=self.generate_s,
                tools_s=self.tools_s,
                interaction_s=self.interaction_s,
                reward_s=reward_s,
                total_s=time.monotonic() - self.started,
                started_at=self.started_at,
            ),
            servers=tuple(self.servers),
            messages=tuple(self.messages),
            metrics=dict(metrics or {}),
            tool_call_metrics=tuple(self.tool_call_metrics),
            phases=tuple(self.phases),
            routed_experts=self.routed_experts,
        )
