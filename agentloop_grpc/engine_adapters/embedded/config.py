"""EmbeddedEngineConfig: every knob of the embedded engine, validated once at construction."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..config_base import LocalModelConfig

MIB = 1 << 20


class EmbeddedEngineConfig(LocalModelConfig):
    """What the embedded engine serves and how much memory and work it may take. ``max_model_len`` is also the KV
    length of one slot and ``max_running`` the number of KV slots (the KV budget is their product)."""

    kind: Literal["embedded"] = Field("embedded", description="The embedded engine (transformers, our scheduler).")
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$", description="Where the weights and the KV cache live: cpu, cuda "
        "or cuda:N (one GPU; sampling reads each step's logits on the host). Checked when the engine starts."
    )
    prefill_chunk: int = Field(
        256, ge=1, description="Prompt tokens prefilled per scheduler step (long prompts are split so running "
        "decodes keep going)."
    )
    prefix_block_size: int = Field(16, ge=1, description="Prefix-cache granularity (tokens per block).")
    prefix_cache_tokens: int = Field(
        32_768, ge=0, description="Prefix-cache capacity in tokens (LRU over blocks); 0 disables it."
    )
    threads: int = Field(
        2, ge=1, description="torch intra-op threads (several servers on one node share its cores)."
    )
    max_images_per_request: int = Field(
        4, ge=1, le=64, description="Images one request may show when the model takes images (a vision-language "
        "checkpoint); more are refused (INVALID_ARGUMENT)."
    )
    grammar_cache_bytes: int = Field(
        64 * MIB, ge=1, description="Memory bound of the cache of compiled grammars (reused across requests with "
        "the same spec)."
    )
    grammar_workers: int = Field(
        2, ge=1, description="Processes that compile grammars, at most (each compiles one at a time; a "
        "compilation is stopped by killing its process). Each starts when a constraint first needs it, taking a "
        "few seconds to load xgrammar: an engine never asked for a constraint runs none."
    )
    grammar_compile_timeout_s: float = Field(
        60.0, gt=0, description="Longest a grammar may compile; past it the request is refused (INVALID_ARGUMENT) "
        "and the compilation killed."
    )
    grammar_max_bytes: int = Field(
        16 * MIB, ge=1, description="Largest compiled grammar (its token masks) a request may use; larger ones are "
        "refused (INVALID_ARGUMENT)."
    )
