"""A tiny Qwen3-MoE checkpoint with random weights, made locally (no hub): the MoE model of the routing tests.

Three decoder layers, the middle one dense (``mlp_only_layers``), so the engine's MoE-layer numbering is tested
too; 8 experts, top-2. The tokenizer is SmolLM2's (the default model's files, copied: loading it would cost
seconds), so prompts are real chat ids and the vocabulary matches. A larger ``initializer_range`` than
transformers' default spreads the router's logits, so a token's top-k is decided by a clear margin and float noise
between two correct implementations cannot flip it.

Run as a script to write one: ``python tests/embedded/tiny_moe.py OUT_DIR``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentloop_grpc.common import model_store

LAYERS = 3
DENSE_LAYERS = (1,)
EXPERTS = 8
TOP_K = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def build(out: Path, tokenizer_folder: Path | None = None, seed: int = 0) -> Path:
    """Write the checkpoint (config, safetensors weights, the tokenizer of ``tokenizer_folder``, default the
    default model's) into ``out`` and return it."""
    source = tokenizer_folder or model_store.prepare()
    text = AutoConfig.from_pretrained(source, local_files_only=True).get_text_config()
    config = Qwen3MoeConfig(  # type: ignore[call-arg]  # head_dim reaches the config through **kwargs
        vocab_size=text.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        decoder_sparse_step=1,
        mlp_only_layers=list(DENSE_LAYERS),
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.5,
        bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    return out


def reference_routing(folder: Path, ids: Sequence[int]) -> np.ndarray:
    """``[len(ids), MoE layers, TOP_K]``: what plain transformers' routers pick for ``ids`` in one forward (read
    with forward hooks on the checkpoint in ``folder``)."""
    model = Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    picked: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: picked.append(out[2]))
             for index, layer in enumerate(model.model.layers) if index not in DENSE_LAYERS]
    with torch.inference_mode():
        model(torch.tensor([list(ids)]))
    for hook in hooks:
        hook.remove()
    return torch.stack(picked, dim=1).numpy()


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
