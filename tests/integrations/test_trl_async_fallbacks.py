"""The CPU fallbacks of AsyncGRPOTrainer (``async_fallbacks.py``): the SDPA tree attention gives each sample of a
packed tree (TRL's own packing, a shared prompt) the logits it has alone, and without CUDA no peak FLOPs (no MFU)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentloop_grpc.integrations.trl.async_fallbacks import (
    TREE_SDPA,
    peak_flops_or_none,
    register_tree_sdpa,
    tree_attention,
)


def test_sdpa_tree_attention_gives_each_packed_sample_its_own_logits():
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.experimental.async_grpo.packing import TreeRow

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    prompt = [5, 9, 12, 3]
    completions = [[7, 8, 2], [7, 30, 31, 40], [50, 51]]  # two share a token past the prompt, one forks at once
    row = TreeRow()
    for completion in completions:
        row.add({"input_ids": np.array(prompt + completion), "group_id": 0, "advantage": 0.0,
                 "completion_mask": np.array([0] * len(prompt) + [1] * len(completion)),
                 "old_log_probs": np.zeros(len(prompt) + len(completion), dtype=np.float32)})
    packed = row.pack()
    assert len(packed["input_ids"]) < sum(len(prompt) + len(c) for c in completions)  # the prompt is shared
    with torch.no_grad():
        alone = [model(torch.tensor([prompt + c])).logits[0] for c in completions]
        # each trained token is predicted at its predecessor's position: the same rows of each sample alone
        expected = torch.cat([logits[len(prompt) - 1:-1] for logits in alone])
        register_tree_sdpa()
        model.set_attn_implementation(TREE_SDPA)
        logits = model(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
                       tree_kv_index=packed["tree_kv_index"], tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
                       tree_cu_seqlens_k=packed["tree_cu_seqlens_k"],
                       tree_max_seqlen_q=int(packed["tree_max_seqlens"][0]),
                       tree_max_seqlen_k=int(packed["tree_max_seqlens"][1])).logits[0]
    assert torch.allclose(logits[packed["token_index"]], expected, atol=1e-5)


def test_without_cuda_the_fallbacks_are_chosen_and_say_why():
    cpu = SimpleNamespace(device=torch.device("cpu"))
    assert peak_flops_or_none(cpu, "float32") is None  # TRL's lookup asserts CUDA: MFU is not computed
    attention, why = tree_attention(torch.device("cpu"))
    assert attention == TREE_SDPA and why is not None and "no CUDA device" in why


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")
def test_on_cuda_the_peak_flops_are_trls():
    from trl.trainer.utils import get_peak_flops_per_device

    gpu = SimpleNamespace(device=torch.device("cuda", 0))
    assert peak_flops_or_none(gpu, "bfloat16") == get_peak_flops_per_device(gpu, "bfloat16")
