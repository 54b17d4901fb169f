"""Trajectory: one finished agent loop, token-exact, as a trainer consumes it.

A trajectory is frozen and validated on construction, so a malformed one (misaligned logprobs, a mask that is not
0/1, a logprob on a tool token) fails where it is built, never inside a training step. ``response_ids`` holds the
model's tokens exactly as the engine produced them, interleaved with the tool/user/template tokens between turns;
``response_mask`` tells them apart (1 = model token, 0 = everything else). ``media`` keeps the pictures the
model saw, each with its span in prompt + response ids (the processor's expansion), so a trainer can rebuild the
model's inputs.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from agentloop_grpc.common.media import MediaInput, check_spans
from agentloop_grpc.common.routed_experts import Routing


class Termination(enum.Enum):
    """Why a loop ended."""

    #: The conversation ended naturally (single turn done, or the interaction said it was done).
    STOP = "stop"
    #: The response length budget (or the model's context) ran out.
    LENGTH = "length"
    #: max assistant turns or max user turns reached.
    TURN_LIMIT = "turn_limit"
    #: Tools were offered and the model answered without calling any.
    NO_TOOL_CALL = "no_tool_call"
    #: Something failed; ``error`` says what and ``infrastructure_failure`` whether it was the model's fault.
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds spent in each phase of one trajectory (summed over turns)."""

    generate_s: float = 0.0
    tools_s: float = 0.0
    interaction_s: float = 0.0
    reward_s: float = 0.0
    total_s: float = 0.0
    #: Wall-clock start, seconds since the epoch (for timelines).
    started_at: float = 0.0


#: ``tokenization``: the recorded ids decode to the rendered text, split into other tokens (the model's own
#: non-canonical tokenization of its text): harmless, the ids are the truth. ``text``: the template renders other
#: text (it re-renders past turns differently, or a delta was wrong): a trainer that re-templates the
#: conversation would train on other tokens than the model produced.
DriftKind = Literal["tokenization", "text"]
#: One line per kind for people reading a summary or a report.
DRIFT_MEANING: dict[str, str] = {
    "tokenization": "same text, other token split (the model's own tokenization): harmless",
    "text": "the template renders other text: a trainer that re-templates would train on other tokens",
}


@dataclass(frozen=True, slots=True)
class Drift:
    """Where the recorded tokens (prompt + response) first depart from a fresh render of the whole conversation,
    and why."""

    #: Index in prompt + response ids: for text drift the token where the texts part, for tokenization drift the
    #: first token that differs.
    position: int
    #: The recorded id and the fresh render's id at ``position`` (None past the end).
    recorded: int | None
    rendered: int | None
    kind: DriftKind = "text"
    #: The recorded ids decoded, and the rendered text, around the place they part (the same span of both).
    recorded_text: str = ""
    rendered_text: str = ""


#: ``ToolCallMetrics.error`` of a call the infrastructure failed (the tool server, or what a tool depends on).
INFRASTRUCTURE_CALL = "infrastructure"


@dataclass(frozen=True, slots=True)
class ToolCallMetrics:
    """One executed tool call: the tool, the turn that made it, and the metrics its server returned."""

    tool: str
    #: 0-based index of the assistant turn that made the call.
    turn: int
    call_id: str
    #: The tool-error kind when the tool's work failed (the model's to learn from), ``infrastructure`` when the
    #: call failed for want of the infrastructure (the trajectory's ``infrastructure_cause`` says what); None when
    #: it succeeded.
    error: str | None = None
    step_reward: float = 0.0
    #: What the tool server's Execute returned (e.g. ``seconds``).
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a trajectory's timeline, in order: a generation, or the tool round or user turn after one."""

    #: ``assistant`` (a generation), ``tool`` (a round of tool calls) or ``user`` (an interaction's reply).
    kind: str
    #: Tokens the phase appended to the context: the generated ones, or the template delta of the tool or user
    #: messages; 0 for a last phase that ended the episode without being appended.
    tokens: int
    #: Wall seconds it took (a generation: every attempt's; a tool round: all its calls, run concurrently).
    seconds: float


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One sample's rollout (see the module docstring)."""

    sample_id: str
    loop: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    #: Aligned with response_ids; 0.0 where the mask is 0.
    response_logprobs: tuple[float, ...]
    #: Aligned with response_ids: the weights version that produced each model token; -1 where the mask is 0.
    weight_versions: tuple[int, ...]
    reward: float
    termination: Termination
    assistant_turns: int = 0
    user_turns: int = 0
    #: One score per interaction turn (user simulator / environment).
    turn_scores: tuple[float, ...] = ()
    #: Step rewards of the tool calls, in call order.
    tool_rewards: tuple[float, ...] = ()
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_tool_calls: int = 0
    #: Whether tool calls were constrained by structured output (the grammar of the call format).
    constrained: bool = False
    infrastructure_failure: bool = False
    #: What failed when ``infrastructure_failure`` is set, for counting: an engine (``engine``), the tool server
    #: (``tool_server_unavailable``, ``tool_deadline``, ...), what a tool depends on (``mcp_server_crashed``), an
    #: agent of the gateway (``agent_timeout``), an environment.
    infrastructure_cause: str | None = None
    error: str | None = None
    drift: Drift | None = None
    #: Generations resumed after an engine abort (partial rollout across a weight update).
    resumed_generations: int = 0
    timings: Timings = field(default_factory=Timings)
    #: The servers that served this trajectory's generations, in order of first use.
    servers: tuple[str, ...] = ()
    #: The conversation for humans (assistant turns with their parsed tool calls).
    messages: tuple[dict[str, Any], ...] = ()
    #: Reward metrics and anything else a reward function reported.
    metrics: dict[str, float] = field(default_factory=dict)
    #: Prompt group (samples of one prompt share it: GRPO).
    group_id: str = ""
    #: The executed tool calls with their servers' metrics, in call order (unknown and malformed calls are not run).
    tool_call_metrics: tuple[ToolCallMetrics, ...] = ()
    #: The pictures of the conversation in order, spans as offsets in prompt_ids + response_ids (the
    #: conversation's image parts name them by index: ``{"type": "image", "media": i}``).
    media: tuple[MediaInput, ...] = ()
    #: The generations and what came between them, in order (what the routing trace replays); empty for
    #: trajectories built outside the loops' episodes (the gateway's).
    phases: tuple[Phase, ...] = ()
    #: What the program that played it tells of it, as text (a coding harness: the CLI's exit code, its output's
    #: tail, the final diff, the tests' counts); empty for our loops.
    metadata: dict[str, str] = field(default_factory=dict)
    #: A MoE model's routed experts of input positions 0.. of prompt + response ids, when the loop asked for them
    #: (routing replay); None otherwise.
    routed_experts: Routing | None = None

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if not (len(self.response_mask) == len(self.response_logprobs) == len(self.weight_versions) == n):
            raise ValueError(
                f"trajectory {self.sample_id}: response_ids ({n}), response_mask ({len(self.response_mask)}), "
                f"response_logprobs ({len(self.response_logprobs)}) and weight_versions "
                f"({len(self.weight_versions)}) must have the same length"
            )
        for i, (mask, logprob, version) in enumerate(
            zip(self.response_mask, self.response_logprobs, self.weight_versions, strict=True)
        ):
            if mask not in (0, 1):
                raise ValueError(f"trajectory {self.sample_id}: response_mask[{i}] is {mask}, not 0 or 1")
            if mask == 0 and (logprob != 0.0 or version != -1):
                raise ValueError(
                    f"trajectory {self.sample_id}: position {i} is not a model token but has a logprob or version"
                )
            if mask == 1 and (logprob > 0.0 or version < 0):
                raise ValueError(
                    f"trajectory {self.sample_id}: model token {i} has logprob {logprob} > 0 or no version"
                )
        prompt_len = len(self.prompt_ids)
        if (problem := check_spans(self.media, prompt_len + n)) is not None:
            raise ValueError(f"trajectory {self.sample_id}: {problem}")
        for i, item in enumerate(self.media):
            if any(self.response_mask[max(0, item.offset - prompt_len) : max(0, item.end - prompt_len)]):
                raise ValueError(f"trajectory {self.sample_id}: media[{i}]'s span holds model tokens (mask 1)")
        if self.routed_experts is not None and self.routed_experts.positions > max(prompt_len + n - 1, 0):
            raise ValueError(
                f"trajectory {self.sample_id}: routing of {self.routed_experts.positions} positions, more than the "
                f"{prompt_len + n - 1} input positions of its {prompt_len + n} tokens"
            )
        if self.termination is not Termination.ERROR and (self.error is not None or self.infrastructure_failure):
            raise ValueError(f"trajectory {self.sample_id}: an error needs termination ERROR")
        if self.infrastructure_cause is not None and not self.infrastructure_failure:
            raise ValueError(f"trajectory {self.sample_id}: an infrastructure cause without an infrastructure failure")

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def min_weight_version(self) -> int | None:
        versions = [v for v in self.weight_versions if v >= 0]
        return min(versions) if versions else None

    @property
    def max_weight_version(self) -> int | None:
        versions = [v for v in self.weight_versions if v >= 0]
        return max(versions) if versions else None

    @property
    def failed(self) -> bool:
        return self.termination is Termination.ERROR


def drift_summary(trajectories: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    """Drifted trajectories per kind (every kind, also at 0), with the first one of each as an example (None when
    there is none), for summaries and reports."""
    summary: dict[str, dict[str, Any]] = {kind: {"count": 0, "example": None} for kind in get_args(DriftKind)}
    for t in trajectories:
        if t.drift is not None:
            entry = summary[t.drift.kind]
            entry["count"] += 1
            if entry["example"] is None:
                entry["example"] = {"sample_id": t.sample_id, **dataclasses.asdict(t.drift)}
    return summary


def routing_summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """The routed experts recorded (routing replay), for summaries and reports: how many trajectories carry them,
    the share of their input positions covered (below 1 where a generation reported none), and their size."""
    routed = [t.routed_experts for t in trajectories if t.routed_experts is not None]
    inputs = sum(max(len(t.prompt_ids) + len(t.response_ids) - 1, 0)
                 for t in trajectories if t.routed_experts is not None)
    covered = sum(r.positions for r in routed)
    size = sum(len(r.ids) for r in routed)
    return {
        "trajectories": len(routed),
        "covered_share": round(covered / inputs, 4) if inputs else 0.0,
        "bytes": size,
        "bytes_per_token": round(size / covered, 1) if covered else 0.0,
    }
