"""The fields every engine config shares. Each adapter's config extends one of these bases and adds a ``kind``
literal, so ``config.EngineConfig`` (their union) tells adapters apart by that field alone."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Tokens a request that sets no max_new_tokens may generate: a bound like SGLang's server's (128), so a first
#: request without sampling params answers in a moment instead of streaming until the context is full.
DEFAULT_MAX_NEW_TOKENS = 256


class EnginePlacement(BaseModel):
    """Where one engine server stands among the data-parallel groups, and what it does with a request that leaves
    its length to the server."""

    model_config = ConfigDict(frozen=True, extra="forbid")  # a misspelt knob must fail, not fall back to a default

    dp_rank: int = Field(0, ge=0, description="This server's data-parallel rank.")
    dp_size: int = Field(1, ge=1, description="Number of data-parallel groups.")
    default_max_new_tokens: int = Field(
        DEFAULT_MAX_NEW_TOKENS, ge=0, le=2**31 - 1,
        description="Tokens a Generate without sampling_params.max_new_tokens may generate (capped by the room "
        "left under max_model_len; reported by GetServerInfo); 0: up to max_model_len, as vLLM's OpenAI server "
        "does.",
    )

    @model_validator(mode="after")
    def _rank_in_range(self) -> EnginePlacement:
        if self.dp_rank >= self.dp_size:
            raise ValueError(f"dp_rank must be in [0, dp_size) (got dp_rank={self.dp_rank}, dp_size={self.dp_size})")
        return self


class EngineLimits(EnginePlacement):
    """Placement plus the request limits of an engine that schedules its own requests."""

    max_model_len: int = Field(4096, ge=2, description="Longest prompt + generation of one request.")
    max_running: int = Field(32, ge=1, description="Requests decoded together (batch capacity).")
    max_waiting: int = Field(
        4096, ge=0, description="Requests that may wait for a batch slot before Generate answers RESOURCE_EXHAUSTED."
    )


class LocalModelConfig(EngineLimits):
    """Limits plus the checkpoint an engine loads in its own process (embedded, vLLM)."""

    model: str | None = Field(
        None, description="A local HF checkpoint folder; None serves the default model (SmolLM2-135M-Instruct, "
        "prepared offline on first use)."
    )
    cache_dir: Path | None = Field(
        None, description="Cache folder for the prepared default model; None means $AGENTLOOP_CACHE or "
        "~/.cache/agentloop."
    )
