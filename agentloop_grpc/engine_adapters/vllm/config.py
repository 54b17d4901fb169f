"""VllmEngineConfig: what the vLLM adapter serves and how much memory and work vLLM may take.

Only the knobs this project needs are exposed; each maps to one vLLM engine argument (``engine_args`` in
``engine.py``). The defaults are the ones that work on a small CPU machine: eager mode (compiled mode takes
minutes longer to start) and an explicit KV-cache size (vLLM's CPU backend otherwise sizes the cache from the
memory node it reads, and refuses to start when that looks too small).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """The vLLM engine behind one server (one data-parallel group)."""

    #: A local HF checkpoint folder; None serves the default model (SmolLM2-135M-Instruct, prepared offline).
    model: str | None = None
    #: Cache folder for the prepared default model; None means $AGENTLOOP_CACHE or ~/.cache/agentloop.
    cache_dir: Path | None = None
    #: Longest prompt + generation of one request.
    max_model_len: int = 4096
    #: Bytes of KV cache vLLM allocates (vLLM's ``kv_cache_memory_bytes``).
    kv_cache_bytes: int = GIB
    #: Requests decoded together (vLLM's ``max_num_seqs``).
    max_running: int = 32
    #: Requests that may be in the engine before Generate answers RESOURCE_EXHAUSTED.
    max_waiting: int = 4096
    #: Eager PyTorch (True) or vLLM's torch.compile'd model (False: faster steps, minutes to start).
    enforce_eager: bool = True
    #: Weights and activations dtype. float32 keeps the default model's logits equal to the embedded engine's.
    dtype: str = "float32"
    #: CPU cores vLLM's OpenMP threads bind to (``VLLM_CPU_OMP_THREADS_BIND``); None lets vLLM choose.
    cpu_cores: str | None = None
    dp_rank: int = 0
    dp_size: int = 1

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.kv_cache_bytes < 1 << 20:
            raise ValueError("kv_cache_bytes must be at least 1 MiB")
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError("max_running must be >= 1 and max_waiting >= 0")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError("dtype must be float32, bfloat16 or float16")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError("dp_rank must be in [0, dp_size)")
