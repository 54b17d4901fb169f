"""SGLang's routed experts as agentloop.v1's per-token routing (TokenChunk.routed_experts, docs/contract.md).

What SGLang returns (server argument ``enable_return_routed_experts``, request field ``return_routed_experts`` of
``GenerateReqInput`` / ``Engine.async_generate``; sources under ``python/sglang/srt/``):

- ``meta_info["routed_experts"]``: base64 of a C-order int32 array ``[positions, num_hidden_layers,
  num_experts_per_tok]`` (``managers/detokenizer_manager.py`` ``_extract_routed_experts``; the decoder sketch is
  ``layers/moe/routed_experts_capturer.py`` ``extract_routed_experts_from_meta_info``), on the *finished* output
  only: the scheduler collects it when the request finishes (``maybe_collect_routed_experts``).
- ``positions`` is ``seqlen - 1``, prompt plus output minus one (``get_routed_experts``: the request's KV slots
  ``req_to_token[: seqlen - 1]``): row i is the forward whose input was token i, our contract's alignment.
- Every decoder layer has ids; the capturer writes those of MoE layers (by ``layer_id``), so a dense layer's stay
  zero. ``moe_layers`` finds the MoE ones from the model's Hugging Face config, by the rules SGLang's models
  apply (Qwen2/3-MoE: not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``; DeepSeek-V2/V3,
  GLM-4.5: ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``; every layer otherwise).
- Rows are kept per KV slot (``_RoutedExpertsHostCache``, written as each forward ends), so prompt positions
  served from the radix cache keep the routing computed when they were first run.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentloop_grpc.common import routed_experts


@dataclass(frozen=True, slots=True)
class RoutingLayout:
    """How SGLang's routing rows are laid out for the served model, and which layers are MoE layers."""

    hidden_layers: int
    moe_layers: tuple[int, ...]
    per_token: int
    num_experts: int

    @property
    def row_bytes(self) -> int:
        return routed_experts.wire_bytes(1, len(self.moe_layers), self.per_token, self.num_experts)


def moe_layers(config: Any) -> tuple[int, ...]:
    """The decoder layers of a Hugging Face text config that have a MoE block (module docstring's rules)."""
    if not routed_experts.expert_count(config):
        return ()
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    step = getattr(config, "decoder_sparse_step", None) or 1
    first = getattr(config, "first_k_dense_replace", None) or 0
    every = getattr(config, "moe_layer_freq", None) or 1
    return tuple(i for i in range(int(config.num_hidden_layers))
                 if i not in dense and (i + 1) % step == 0 and i >= first and i % every == 0)


def layout_of(config: Any) -> RoutingLayout | None:
    """The routing layout of a model served with ``enable_return_routed_experts``; None for a dense model."""
    layers = moe_layers(config)
    if not layers:
        return None
    return RoutingLayout(
        int(config.num_hidden_layers), layers, int(config.num_experts_per_tok), routed_experts.expert_count(config)
    )


def packed_rows(encoded: str | None, layout: RoutingLayout) -> bytes:
    """``meta_info["routed_experts"]`` as our packed rows of the MoE layers (b"" when SGLang sent none)."""
    if not encoded:
        return b""
    ids = np.frombuffer(base64.b64decode(encoded), dtype="<i4")
    row = layout.hidden_layers * layout.per_token
    if ids.size % row:
        raise RuntimeError(f"SGLang's routed_experts hold {ids.size} ids, not rows of {layout.hidden_layers} layers "
                           f"x {layout.per_token}")
    rows = ids.reshape(-1, layout.hidden_layers, layout.per_token)[:, layout.moe_layers, :]
    return routed_experts.pack(rows, layout.num_experts)
