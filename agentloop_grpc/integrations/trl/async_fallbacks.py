"""What AsyncGRPOTrainer (trl 1.16) needs CUDA for, and what stands in where it is absent.

- **Peak FLOPs.** Its constructor reads the device's name through ``torch.cuda.get_device_name`` to look up its
  peak FLOPs (an AssertionError on a CPU build of torch, a ValueError for a CPU device on a CUDA build).
  ``peak_flops_or_none`` asks TRL only for a CUDA device and otherwise answers None: the peak is unknown, so the
  trainer logs no ``perf/mfu_*`` metric at all (TRL's own behaviour for an unknown GPU) rather than an MFU made
  from an invented peak. Throughput (``perf/*tok_s*``) and timings are still logged.
- **Tree attention.** Its model's attention is ``tree_fa3``: FlashAttention 3 from the Hub (the ``kernels``
  package) over the packed tree of samples. ``tree_attention_sdpa`` computes the same attention with torch's SDPA,
  segment by segment (each packed segment attends causally to the K/V of its root-to-segment path: TRL's
  ``packing.py``), exact on CPU and on GPU and slower for long packs; ``tree_attention`` picks it when there is no
  CUDA device or the kernel cannot be loaded (no ``kernels`` package, no Hub), and says why.
"""

from __future__ import annotations

from typing import Any

TREE_SDPA = "tree_sdpa"


def peak_flops_or_none(accelerator: Any, dtype: str) -> float | None:
    """TRL's ``get_peak_flops_per_device`` on a CUDA device; None (MFU not computed) on any other."""
    from trl.trainer.utils import get_peak_flops_per_device

    return get_peak_flops_per_device(accelerator, dtype) if accelerator.device.type == "cuda" else None


def tree_attention_sdpa(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                        tree_cu_seqlens_k, scaling=None, sliding_window=None, softcap=None, **kwargs):
    """TRL's tree attention with ``torch.nn.functional.scaled_dot_product_attention`` (see the module docstring):
    ``query`` (1, heads, packed tokens, dim), ``key``/``value`` (1, kv heads, packed tokens, dim); segment ``s``'s
    queries are ``tree_cu_seqlens_q[s]:[s+1]``, its keys ``tree_kv_index[tree_cu_seqlens_k[s]:[s+1]]``."""
    import torch

    if sliding_window or softcap:
        raise NotImplementedError("tree_sdpa has no sliding window or logit softcap: use tree_fa3 (CUDA) for this "
                                  "model")
    q_bounds, k_bounds, out = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist(), []
    for s in range(len(q_bounds) - 1):
        q = query[:, :, q_bounds[s]:q_bounds[s + 1]]
        path = tree_kv_index[k_bounds[s]:k_bounds[s + 1]]
        k, v = key.index_select(2, path), value.index_select(2, path)
        # the segment's queries are the last of its path: query i sees the path up to its own position
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(
            diagonal=k.shape[2] - q.shape[2])
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=scaling,
                                                                    enable_gqa=True))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def tree_attention(device: Any) -> tuple[str, str | None]:
    """(the attention implementation to train with on ``device``, why it is not TRL's ``tree_fa3``, or None)."""
    from trl.experimental.async_grpo import packing

    if device.type != "cuda":
        return TREE_SDPA, f"no CUDA device ({device.type}): FlashAttention 3 has no build for it"
    try:
        packing._flash_attn()  # TRL's own loader: the kernel from the Hub, cached
    except Exception as exc:  # noqa: BLE001 - no kernels package, a Hub error, no build for this GPU: all absent
        return TREE_SDPA, f"FlashAttention 3 could not be loaded ({type(exc).__name__}: {exc})"
    return packing.TREE_ATTENTION, None


def register_tree_sdpa() -> None:
    """Make ``tree_sdpa`` an attention implementation transformers knows (as TRL registers ``tree_fa3``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(TREE_SDPA, tree_attention_sdpa)
    AttentionMaskInterface.register(TREE_SDPA, lambda **kwargs: None)  # the tree's segments are the mask
