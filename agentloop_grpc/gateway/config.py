"""GatewayConfig: what the session gateway serves, what it forces for training, and the bounds that keep it alive
whatever its clients send."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentloop_grpc.agent.parsers import ParserName


class ForcedSampling(BaseModel):
    """Sampling the gateway imposes whatever the agent sends (None: the agent's value, or the engine's default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: float | None = Field(None, ge=0.0, le=10.0, description="Every turn's temperature.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Every turn's nucleus mass.")
    max_tokens_per_turn: int = Field(
        1024, ge=1, le=2**31 - 1, description="Upper bound of one turn's tokens (an agent's max_tokens is capped).")
    response_budget: int = Field(
        8192, ge=1, le=2**31 - 1, description="Tokens one chain may append after its prompt (model and context, as "
        "our loops' response_budget); a turn that would start past it ends at once with finish_reason length.")


class GatewayLimits(BaseModel):
    """Bounds on what one request or session may hold; past one, the request gets a 4xx naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(8 * 2**20, ge=1024, description="A request body's bytes (413 beyond).")
    max_messages: int = Field(4096, ge=1, description="Messages in one request.")
    max_tools: int = Field(256, ge=0, description="Tools offered in one request.")
    max_stop: int = Field(16, ge=0, description="Stop strings in one request.")
    max_top_logprobs: int = Field(20, ge=0, description="top_logprobs of one request.")
    max_concurrent_per_session: int = Field(
        16, ge=1, description="Requests of one session in flight at once (429 beyond).")
    max_sessions: int = Field(100_000, ge=1, description="Live sessions; creating one more is a 429.")
    session_ttl_s: float = Field(
        3600.0, gt=0, description="A session untouched this long is dropped (its trajectories with it; counted).")
    max_header_bytes: int = Field(
        64 * 2**10, ge=1024, description="A request's line and headers (a 431 and the connection closed beyond).")
    header_timeout_s: float = Field(
        30.0, gt=0, description="A request's line and headers must arrive within this of its first byte (a 408 "
        "and the connection closed beyond).")
    body_timeout_s: float = Field(
        60.0, gt=0, description="A request's body must arrive within this of its headers' end (a 408 in the API's "
        "error shape and the connection closed beyond).")
    idle_timeout_s: float = Field(
        60.0, gt=0, description="A connection with no request under way is closed after this (longer than "
        "clients keep idle connections, 5 s for httpx, so that they close first).")
    max_connections: int = Field(4096, ge=1, description="Open connections; one more is closed as it is accepted.")


class GatewayConfig(BaseModel):
    """The session gateway in front of the Router."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("agentloop", description="The model name GET /models lists and replies carry.")
    tool_parser: ParserName = Field("hermes", description="How the model writes tool calls (the run's format).")
    chat_template: str | None = Field(None, description="As AgentLoopConfig.chat_template (None: the tokenizer's).")
    sampling: ForcedSampling = Field(default_factory=ForcedSampling)
    limits: GatewayLimits = Field(default_factory=GatewayLimits)
    when_paused: Literal["wait", "retry"] = Field(
        "wait", description="A request arriving while the engines are paused for a weight update: wait (the engine "
        "holds it) or retry (a 503 with Retry-After, for agents whose own timeouts are short).")
    retry_after_s: float = Field(1.0, gt=0, description="The Retry-After of when_paused: retry.")
    generate_timeout_s: float = Field(600.0, gt=0, description="Deadline of one turn, failovers included.")
    max_resumes: int = Field(16, ge=0, description="Resumes of one turn after aborts (weight updates).")
    return_routed_experts: bool = Field(
        False, description="Record the experts a MoE model routed every token to in the trajectories "
        "(Trajectory.routed_experts, as AgentLoopConfig's); engines that cannot report them are refused when the "
        "gateway starts (or at its first request, if none had answered by then), never turn by turn.")
