"""ModelRunner: the forward pass of a Llama-family decoder over the slot KV cache.

A vision-language checkpoint (e.g. Idefics3) runs the same way: its text model is the decoder (sizes and type
from ``config.get_text_config()``) and prefill may write image features over the embeddings of image tokens.

transformers' modules are reused for everything that has no state (embedding, RMSNorms, projections, rotary
embedding, MLP, LM head), so numerics match the reference implementation; only attention is ours, because it
reads and writes our slot cache with per-row positions. One method serves both phases:

* prefill: one slot, a chunk of consecutive prompt tokens (``T > 1``), attending to the slot's earlier positions;
* decode: rows ``[0, m)``, one token each at its own position.

Masks are boolean ``key_position <= query_position`` per row, so stale KV past a row's length is never read.

A mixture-of-experts decoder (Qwen3-MoE) runs the same way: its sparse blocks are transformers' own, called as
their ``forward`` does (router, then experts), so the runner also has each token's routed expert ids in hand and
returns them when a caller asks (routing replay: a trainer routes each token to the experts inference used).

Device: the layers and the KV cache live on ``device``; the scheduler's host tensors (ids, positions, image
features) are moved there, and the logits come back to the host, one copy per step, for sampling.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from .kv_cache import KVShape, SlotKVCache

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral", "qwen3", "qwen3_moe"})
#: Models whose attention normalises each head's queries and keys (RMSNorm over head_dim) before rotary.
QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ModelRunner:
    """Runs the model's layers on token chunks, reading and writing a SlotKVCache."""

    def __init__(self, model: PreTrainedModel, slots: int, max_len: int, device: torch.device | None = None) -> None:
        config = model.config.get_text_config()
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"the embedded engine runs {sorted(SUPPORTED_MODEL_TYPES)} models, not {config.model_type!r}"
            )
        if (
            getattr(config, "sliding_window", None)
            and getattr(config, "use_sliding_window", True)
            and (config.sliding_window < max_len)
        ):
            raise ValueError(f"sliding-window attention ({config.sliding_window}) is not supported")
        self.model = model
        self.decoder = model.get_decoder()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.device = device or torch.device("cpu")
        self.qk_norm = config.model_type in QK_NORM_MODEL_TYPES
        #: Index of each layer among the MoE layers, or -1 for a dense one; routing is reported for MoE layers.
        self.moe_index: list[int] = []
        for layer in self.decoder.layers:
            sparse = isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
            self.moe_index.append(sum(index >= 0 for index in self.moe_index) if sparse else -1)
        self.moe_layers = sum(index >= 0 for index in self.moe_index)
        self.experts_per_token = config.num_experts_per_tok if self.moe_layers else 0
        self.num_experts = config.num_experts if self.moe_layers else 0
        self.kv = SlotKVCache(
            KVShape(config.num_hidden_layers, slots, self.kv_heads, max_len, self.head_dim), self.device
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        first_row: int,
        kv_len: int,
        images: tuple[torch.Tensor, torch.Tensor] | None = None,
        routing: bool = False,
        last: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits at the last position of each row (``last[b]`` when given: rows of a ragged prefill batch end
        in padding), on the host, and with ``routing`` (a MoE model) the expert ids every position was routed to,
        ``[B, T, moe_layers, experts_per_token]`` int64 on the host (else None).

        ``input_ids`` and ``positions`` are ``[B, T]``; row ``b`` lives in slot ``first_row + b``; every row attends
        to its slot's positions ``[0, kv_len)`` up to its own position (the new tokens are written first, padding
        included: a caller pads a row only at positions past its own, which nothing reads before it rewrites them).
        ``images`` (a prefill chunk, ``B == 1``): indexes within the chunk and the image features that replace
        those tokens' embeddings.
        """
        device = self.device
        input_ids, positions = input_ids.to(device), positions.to(device)
        batch, steps = input_ids.shape
        rows = torch.arange(first_row, first_row + batch, device=device)
        hidden = self.decoder.embed_tokens(input_ids)
        if images is not None:
            hidden[0, images[0].to(device)] = images[1].to(device, hidden.dtype)
        cos, sin = self.decoder.rotary_emb(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        # [B, 1, T, kv_len]
        mask = (torch.arange(kv_len, device=device)[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        write_rows, write_pos = rows[:, None], positions
        routes: list[torch.Tensor] = []
        for layer, moe_index, keys, values in zip(self.decoder.layers, self.moe_index, self.kv.keys, self.kv.values):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(batch, steps, -1, self.head_dim)
            k = attn.k_proj(x).view(batch, steps, -1, self.head_dim)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = attn.v_proj(x).view(batch, steps, -1, self.head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            keys[write_rows, :, write_pos] = k.transpose(1, 2)
            values[write_rows, :, write_pos] = v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q,
                keys[first_row : first_row + batch, :, :kv_len],
                values[first_row : first_row + batch, :, :kv_len],
                attn_mask=mask,
                scale=self.scaling,
                enable_gqa=self.heads != self.kv_heads,
            )
            out = attn.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))
            hidden = residual + out
            x = layer.post_attention_layernorm(hidden)
            if moe_index < 0:
                hidden = hidden + layer.mlp(x)
            else:
                hidden = hidden + self._sparse_mlp(layer.mlp, x, routes)
        ends = hidden[:, -1] if last is None else hidden[torch.arange(batch, device=device), last.to(device)]
        logits = self.model.lm_head(self.decoder.norm(ends)).cpu()
        if not (routing and routes):
            return logits, None
        return logits, torch.stack(routes, dim=1).view(batch, steps, self.moe_layers, -1).cpu()

    @staticmethod
    def _sparse_mlp(block: Qwen3MoeSparseMoeBlock, x: torch.Tensor, routes: list[torch.Tensor]) -> torch.Tensor:
        """Qwen3MoeSparseMoeBlock.forward, keeping the router's top-k expert ids (``[B*T, k]``) in ``routes``."""
        flat = x.reshape(-1, x.shape[-1])
        _, weights, experts = block.gate(flat)
        routes.append(experts)
        return block.experts(flat, experts, weights).view_as(x)
