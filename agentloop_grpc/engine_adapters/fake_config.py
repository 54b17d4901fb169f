"""FakeEngineConfig: shape and speed of the fake engine (``fake.FakeEngine``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agentloop_grpc.common.types import GenerateRequest

from .config_base import EngineLimits


class FakeEngineConfig(EngineLimits):
    """Shape and speed of the fake engine (no model: tokens are a deterministic function of the prompt)."""

    kind: Literal["fake"] = Field("fake", description="The fake engine: no model, for tests and overhead benchmarks.")
    max_running: int = Field(64, ge=1, description="Batch capacity: requests decoded at once.")
    vocab_size: int = Field(32_000, ge=3, description="Vocabulary size (token ids are drawn below it).")
    eos_token_id: int = Field(2, ge=0, description="The id that ends a reply (inside the vocabulary).")
    token_latency_s: float = Field(
        0.0, description="Seconds one decode step takes (every running request gets one token per step)."
    )
    prefill_latency_s_per_token: float = Field(
        0.0, description="Seconds of prefill per prompt token not served from the prefix cache."
    )
    block_size: int = Field(16, ge=1, description="Prefix-cache granularity in tokens.")
    cache_blocks: int = Field(65_536, description="Prefix-cache capacity in blocks (LRU).")
    max_images_per_request: int = Field(
        4, ge=0, description="Images one request may carry (GenerateRequest.media); 0: the fake takes no images."
    )
    routed_expert_layers: int = Field(
        0, ge=0, le=256, description="Stand in for a MoE model whose routing it reports (return_routed_experts): its "
        "MoE layers; 0: it refuses the opt-in, as a dense model's engine does.")
    routed_experts_per_token: int = Field(8, ge=1, le=64, description="Top-k of the stood-in MoE model.")
    num_experts: int = Field(128, ge=1, le=65_536, description="Experts per layer of the stood-in MoE model.")
    # a function cannot come from a file or a command line, so it is left out of dumps (the launcher's flags)
    script: Callable[[GenerateRequest], Sequence[int]] | None = Field(
        None, exclude=True, repr=False,
        description="Scripted replies (agent-loop tests): when set, a request's tokens are script(request) followed "
        "by eos, instead of the hash stream. Greedy or not, the script decides; logprobs stay the fake's own.",
    )

    @field_validator("token_latency_s", "prefill_latency_s_per_token")
    @classmethod
    def _latency(cls, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("latencies must be >= 0")
        return seconds

    @model_validator(mode="after")
    def _eos_in_vocabulary(self) -> FakeEngineConfig:
        if self.eos_token_id >= self.vocab_size:
            raise ValueError(f"eos_token_id {self.eos_token_id} must be below vocab_size {self.vocab_size}")
        return self
