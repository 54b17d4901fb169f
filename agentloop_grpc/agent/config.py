"""AgentLoopConfig: every limit of a loop, with bounds and the reason for each (pydantic, frozen)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentloop_grpc.common.types import SamplingParams

from .parsers import ParserName

INT32_MAX = 2**31 - 1
#: A seed plus its offset wraps below 2**63: engines take signed 64-bit seeds.
SEED_MAX = 2**63 - 1


class SamplingConfig(BaseModel):
    """Sampling of one assistant turn (logprobs are always requested: trajectories need them)."""

    # bounds are the wire's (int32 ids, an unsigned seed) and the engines': a value out of them is refused here,
    # by name, before a loop starts, rather than failing every trajectory's first generate
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass kept.")
    top_k: int = Field(-1, ge=-1, le=INT32_MAX, description="Keep the k most likely tokens; -1 keeps all.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Drop tokens below min_p times the top probability.")
    repetition_penalty: float = Field(1.0, gt=0.0, description="1.0 is off.")
    seed: int | None = Field(
        None, ge=0, le=SEED_MAX,
        description="Base seed; each generation adds a stable offset (sample, turn) so runs repeat.",
    )
    stop_token_ids: tuple[Annotated[int, Field(ge=0, le=INT32_MAX)], ...] = Field(
        (), description="Extra ids that end a turn (the template's eos always does)."
    )

    def params(self, max_new_tokens: int, seed_offset: int, routed_experts: bool = False) -> SamplingParams:
        """One generation's sampling: this config's, with its budget and seed; ``routed_experts``: ask for the
        experts each token was routed to."""
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=None if self.seed is None else (self.seed + seed_offset) % (SEED_MAX + 1),
            stop_token_ids=self.stop_token_ids,
            logprobs=True,
            return_routed_experts=routed_experts,
        )


class AgentLoopConfig(BaseModel):
    """Limits and behaviour of the agent loops."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_assistant_turns: int = Field(8, ge=1, le=1000, description="Model turns before the loop stops (TURN_LIMIT).")
    max_user_turns: int | None = Field(
        4, ge=0, le=1000, description="User turns appended before the loop stops (TURN_LIMIT): interaction (user "
        "simulator) replies only, unless count_tool_rounds_as_user_turns; tool rounds are otherwise bounded by "
        "max_assistant_turns alone. The model still answers the last user turn appended. None: no limit (verl's "
        "null)."
    )
    count_tool_rounds_as_user_turns: bool = Field(
        False, description="verl's counting: each turn of tool responses counts against max_user_turns too (verl's "
        "multi_turn.max_user_turns). Trajectory.user_turns still counts interaction replies only."
    )
    max_parallel_tool_calls: int = Field(
        4, ge=1, le=64, description="Calls of one turn executed concurrently; extra calls get a tool-error message."
    )
    max_tool_response_chars: int = Field(
        2048, ge=16, description="A tool response longer than this is truncated before it is encoded."
    )
    tool_response_truncation: Literal["left", "right", "middle"] = Field(
        "right", description="Which part of a long tool response is cut: right keeps the start, left keeps the "
        "end, middle keeps both ends."
    )
    max_prompt_tokens: int = Field(2048, ge=1, description="A longer first prompt fails the sample (model error).")
    response_budget: int = Field(
        1024, ge=1, description="Tokens after the prompt (model, tool and user tokens together); LENGTH past it."
    )
    max_new_tokens_per_turn: int = Field(256, ge=1, description="Upper bound of one assistant turn.")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="Sampling of every turn (a Sample's own sampling, e.g. greedy "
        "for validation, replaces it and turn_sampling for every turn of that sample)..."
    )
    turn_sampling: tuple[SamplingConfig, ...] = Field(
        (), description="...except turn i (0-based) uses turn_sampling[i] when present."
    )
    constrain_tool_calls: bool = Field(
        False, description="Force every assistant turn of the tool loop to be well-formed tool calls (structured "
        "output with the parser's grammar); the trajectory records it. The loop then ends when a tool or an "
        "interaction ends it, or at a limit."
    )
    tool_parser: ParserName = Field(
        "hermes", description="Format of tool calls in the model's text: hermes (a JSON call in tool_call tags), "
        "qwen3_coder (Qwen3-Coder's XML-style function and parameter tags, values typed by the tool's schema), "
        "llama3_json (Llama 3's JSON calls with name and parameters, maybe after its python tag, several joined by "
        "';') or gpt_oss (harmony messages addressed to=functions.NAME; it has no grammar, so not with "
        "constrain_tool_calls)."
    )
    resume_on_abort: bool = Field(
        True, description="A generation the engine aborted (Pause ABORT before a weight update) continues from the "
        "tokens it had, once the engine resumes: partial rollout."
    )
    max_resumes: int = Field(16, ge=0, description="Resumes of one generation before the trajectory fails.")
    drift_check: Literal["strict", "report", "off"] = Field(
        "report", description="Re-render the conversation at the end and compare with the recorded ids: strict "
        "fails the trajectory on a difference, report records the first difference, off skips the check."
    )
    chat_template: str | None = Field(
        None, description="The chat template conversations are encoded with: Jinja text, or the path of a file "
        "holding it (a value without '{{' or '{%' is a path, read when the config is loaded, relative to the "
        "working directory); None: the tokenizer's own. Engines take token ids and never apply a template, so it "
        "is the loop's alone."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra variables of every render of the template, e.g. "
        "{enable_thinking: false} for Qwen3's."
    )
    return_routed_experts: bool = Field(
        False, description="Record the experts a MoE model routed every token to (Trajectory.routed_experts, "
        "for routing replay in training); every engine must report routing (GetServerInfo routed_expert_layers), "
        "else the rollout is refused before it starts."
    )
    generate_timeout_s: float = Field(600.0, gt=0, description="Deadline of one generation.")
    end_on_tool: tuple[str, ...] = Field(
        ("check_answer",), description="Tools whose call ends the episode (the final answer was submitted)."
    )

    @field_validator("chat_template")
    @classmethod
    def _read_template_file(cls, value: str | None) -> str | None:
        # a file's text is carried in the config, so a worker on another machine needs no copy of the file
        if value is None or "{{" in value or "{%" in value:
            return value
        try:
            return Path(value).read_text()
        except OSError as error:
            raise ValueError(f"chat_template {value!r} is neither Jinja text nor a readable file ({error})") from None

    @model_validator(mode="after")
    def _grammar_exists(self) -> AgentLoopConfig:
        # gpt_oss writes its calls in special tokens, which no grammar the engines take can emit
        if self.constrain_tool_calls and self.tool_parser == "gpt_oss":
            raise ValueError("constrain_tool_calls is not available with tool_parser gpt_oss (it has no grammar)")
        return self

    def sampling_for(self, turn: int) -> SamplingConfig:
        return self.turn_sampling[turn] if turn < len(self.turn_sampling) else self.sampling
