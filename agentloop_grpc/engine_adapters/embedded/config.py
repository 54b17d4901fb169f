"""EmbeddedEngineConfig: every knob of the embedded engine, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class EmbeddedEngineConfig:
    """What the embedded engine serves and how much memory and work it may take."""

    #: A local HF checkpoint folder; None serves the default model (SmolLM2-135M-Instruct, prepared on first use).
    model: str | None = None
    #: Cache folder for the prepared default model; None means $AGENTLOOP_CACHE or ~/.cache/agentloop.
    cache_dir: Path | None = None
    #: Longest prompt + generation of one request (also the KV length of one slot).
    max_model_len: int = 4096
    #: KV slots: requests decoded together in one batched step (the KV budget is slots x max_model_len).
    max_running: int = 32
    #: Requests that may wait for a slot before Generate answers RESOURCE_EXHAUSTED.
    max_waiting: int = 4096
    #: Prompt tokens prefilled per scheduler step (long prompts are split so running decodes keep going).
    prefill_chunk: int = 256
    #: Prefix-cache granularity (tokens per block) and capacity in tokens (LRU over blocks); 0 disables it.
    prefix_block_size: int = 16
    prefix_cache_tokens: int = 32_768
    #: torch intra-op threads (this project's reference machine has 2 cores).
    threads: int = 2
    #: Memory bound of the cache of compiled grammars (reused across requests with the same spec).
    grammar_cache_bytes: int = 64 * 1024 * 1024
    #: Processes that compile grammars (each compiles one at a time; a compilation is stopped by killing its process).
    grammar_workers: int = 2
    #: Longest a grammar may compile; past it the request is refused (INVALID_ARGUMENT) and the compilation killed.
    grammar_compile_timeout_s: float = 60.0
    #: Largest compiled grammar (its token masks) a request may use; larger ones are refused (INVALID_ARGUMENT).
    grammar_max_bytes: int = 16 * 1024 * 1024
    dp_rank: int = 0
    dp_size: int = 1

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError("max_running must be >= 1 and max_waiting >= 0")
        if self.prefill_chunk < 1 or self.prefix_block_size < 1 or self.prefix_cache_tokens < 0:
            raise ValueError("prefill_chunk >= 1, prefix_block_size >= 1 and prefix_cache_tokens >= 0 required")
        if self.threads < 1 or self.grammar_cache_bytes < 1:
            raise ValueError("threads and grammar_cache_bytes must be >= 1")
        if self.grammar_workers < 1 or self.grammar_compile_timeout_s <= 0 or self.grammar_max_bytes < 1:
            raise ValueError("grammar_workers >= 1, grammar_compile_timeout_s > 0 and grammar_max_bytes >= 1 required")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError("dp_rank must be in [0, dp_size)")
