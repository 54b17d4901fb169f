"""vLLM's routed experts as agentloop.v1's per-token routing (TokenChunk.routed_experts, docs/contract.md).

What vLLM 0.32 gives (engine argument ``enable_return_routed_experts``; sources under ``vllm/``):

- ``CompletionOutput.routed_experts`` (``outputs.py``): a ``[rows, layers, top_k]`` array, uint8 when the model
  has at most 256 experts, else uint16 (``RoutedExpertsCapturer.output_dtype_name``), set on the *finished*
  output only: the output processor collects each step's rows per request and concatenates them when the request
  finishes (``v1/engine/output_processor.py``, ``RequestState.make_request_output``).
- ``layers`` counts every decoder layer, dense ones too (``_get_routed_experts_shape``: the model's
  ``total_num_hidden_layers``); the capturer writes only the layers whose MoE router it hooked (by ``layer_id``),
  so a dense layer's ids are zeros. ``moe_layer_ids`` finds the hooked layers the way vLLM binds them
  (``bind_routed_experts_capturer``), and only those reach our clients.
- ``rows`` covers the request's input positions ``routed_experts_prompt_start`` (0: we never skip) up to
  ``prompt + output - 2``: the scheduler's connector emits rows up to ``num_tokens - 1``
  (``AuxOutputSchedulerConnector.take_output``), so each output token's row is the step whose input was the
  token before it, our contract's alignment. A preempted request resumes from its last row, not from zero.
- Prompt positions served from vLLM's prefix cache still have their rows: vLLM stores each full KV block's
  routing under the block's hash and reads it back on a hit (``aux_output_connector/worker.py``); its store is
  sized to the KV cache and fails the request rather than answer with a missing block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import TokenChunk

from ..routed_rows import split_rows


@dataclass(frozen=True, slots=True)
class RoutingLayout:
    """Which of vLLM's routing layers are MoE layers, and the model's top-k and expert count."""

    moe_layers: tuple[int, ...]
    per_token: int
    num_experts: int


def moe_layer_ids(model: torch.nn.Module) -> list[int]:
    """The decoder layers whose router vLLM's routed-experts capturer hooks, in model order (run in a worker)."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner
    from vllm.model_executor.layers.fused_moe.routed_experts_capturer import RoutedExpertsCaptureSource

    return sorted({int(module.layer_id) for module in model.modules()
                   if isinstance(module, (MoERunner, RoutedExpertsCaptureSource))})


def attach(
    routed: np.ndarray | None, layout: RoutingLayout, prompt_tokens: int, chunks: Sequence[TokenChunk]
) -> tuple[bytes, list[TokenChunk]]:
    """The prompt's packed routing, and ``chunks`` (every output token of the request, in order) each with its
    tokens' routing, from the finished output's ``routed_experts`` (``routed_rows.split_rows``)."""
    row_bytes = routed_experts.wire_bytes(1, len(layout.moe_layers), layout.per_token, layout.num_experts)
    packed = b""
    if routed is not None and routed.ndim == 3 and routed.shape[2] == layout.per_token:
        packed = routed_experts.pack(routed[:, layout.moe_layers, :], layout.num_experts)
    elif routed is not None:
        raise RuntimeError(f"vLLM returned routed experts of shape {routed.shape}; [positions, layers, "
                           f"{layout.per_token}] expected")
    return split_rows(packed, row_bytes, prompt_tokens, chunks, "vLLM")
