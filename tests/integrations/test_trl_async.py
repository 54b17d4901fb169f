"""Fully-async GRPO on the real default model: TRL's GRPOTrainer trains groups that rolled out while it trained
the previous step (``AsyncAgentLoopRollout``), each at most ``max_staleness`` versions behind its weights; the
engines end on the trainer's last weights. An engine of this module's own: it takes pushed weights."""

from __future__ import annotations

import pytest
import torch

from agentloop_grpc.agent import WorkerSpec
from agentloop_grpc.integrations.trl import AsyncAgentLoopRollout, WeightSyncCallback, agentloop_reward, prompt_dataset

from .test_trl_grpo import LOOP, ROWS, grpo_config, position_in_group

pytestmark = pytest.mark.slow


def test_async_steps_train_groups_at_most_max_staleness_versions_behind(own_servers, model, tmp_path):
    """Fully-async: the next step's group rolls out while the trainer trains; each step trains groups whose
    oldest token is at most max_staleness (1) versions behind its weights, the engines end on the last version."""
    from trl import GRPOTrainer

    engine, tools, _, _ = own_servers
    model, tokenizer = model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    spec = WorkerSpec(engines=(engine,), tool_server=tools, loop=LOOP)
    with AsyncAgentLoopRollout(spec, ROWS, check_logprobs=2, max_staleness=1) as rollout:
        trainer = GRPOTrainer(
            model=model, reward_funcs=[agentloop_reward, position_in_group], args=grpo_config(tmp_path, 2),
            train_dataset=prompt_dataset(ROWS), processing_class=tokenizer, rollout_func=rollout,
            callbacks=[WeightSyncCallback(rollout)],
        )
        trainer.train()
        base = rollout.base_version
        assert rollout.engine_versions() == {engine: base + 2}

    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)
    steps = rollout.history
    assert [s.step for s in steps] == [0, 1]
    lags = []
    for record in steps:
        assert len(record.trajectories) == 2 and not any(t.failed for t in record.trajectories)
        for t in record.trajectories:
            versions = [v for v, m in zip(t.weight_versions, t.response_mask) if m]
            assert base <= min(versions) and max(versions) <= base + record.step, (record.step, versions)
            lags.append(base + record.step - min(versions))
        assert record.metrics["staleness_max"] == max(lags[-2:]) <= 1
        assert record.metrics["dropped_stale"] == 0
    assert 1 in lags  # a group rolled out ahead, while the trainer trained, and was trained one version late
    checked = [s.metrics for s in steps if "logprob_diff_sampler_max" in s.metrics]
    assert checked and all(m["logprob_diff_sampler_max"] < 2e-3 for m in checked), checked  # fresh: same weights


def tree_attention_on_cpu(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                          tree_cu_seqlens_k, scaling=None, **kwargs):
    """TRL's tree attention (packing.py: each packed segment attends causally to the K/V of its root-to-segment
    path) with torch's SDPA instead of FlashAttention 3, which has no CPU build: the test's, not ours."""
    q_bounds, k_bounds, out = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist(), []
    for s in range(len(q_bounds) - 1):
        q = query[:, :, q_bounds[s]:q_bounds[s + 1]]
        path = tree_kv_index[k_bounds[s]:k_bounds[s + 1]]
        k, v = key.index_select(2, path), value.index_select(2, path)
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(diagonal=k.shape[2] - q.shape[2])
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=scaling,
                                                                    enable_gqa=True))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def test_trls_async_grpo_trainer_trains_on_our_worker_and_weight_transfer(own_servers, tmp_path, monkeypatch):
    """TRL's own AsyncGRPOTrainer consumes our RolloutSamples and pushes through our weight transfer. It needs CUDA
    as shipped (trl 1.16: peak-FLOPs lookup through torch.cuda at init; FlashAttention 3 from the Hub as its
    attention): this test swaps those two for CPU ones, and runs the rest of the trainer as it is."""
    import datasets
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from agentloop_grpc.common import model_store
    from agentloop_grpc.integrations.trl.async_worker import AgentLoopRolloutWorker, AgentLoopWeightTransfer

    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda *args: None)
    AttentionInterface.register("tree_sdpa_test", tree_attention_on_cpu)
    AttentionMaskInterface.register("tree_sdpa_test", lambda **kwargs: None)
    engine, tools, _, _ = own_servers
    checkpoint = model_store.prepare()
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        num_generations=2, max_staleness=1, learning_rate=1e-5, temperature=1.0, use_cpu=True, bf16=False,
        gradient_checkpointing=False, token_budget=0, report_to=[], save_strategy="no", disable_tqdm=True,
    )
    # unconstrained calls: the trainer's ratio reads the engine's logprobs as the sampling policy's
    loop = LOOP.model_copy(update={"constrain_tool_calls": False})
    with AsyncAgentLoopRollout(WorkerSpec(engines=(engine,), tool_server=tools, loop=loop), ROWS,
                               check_logprobs=0, max_staleness=1) as rollout:
        worker = AgentLoopRolloutWorker(rollout, num_generations=2, groups_per_step=1)
        transfer = AgentLoopWeightTransfer(rollout)
        trainer = AsyncGRPOTrainer(
            str(checkpoint), args=args, train_dataset=datasets.Dataset.from_list([{"prompt": r["messages"]}
                                                                                 for r in ROWS]),
            processing_class=model_store.load_tokenizer(checkpoint), rollout_worker=worker, weight_transfer=transfer,
        )
        trainer.model.set_attn_implementation("tree_sdpa_test")
        trainer.train()
        base = rollout.base_version
        # the cold sync at train begin, then one after each step: the trainer's model_version is the engines'
        assert transfer.sent == trainer.model_version == 3
        assert rollout.engine_versions() == {engine: base + 3}
        assert rollout.stream is None  # the trainer stopped the worker; the rollout is ours to close
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    # step 1 trained samples of version 1, the weights it held: its ratio to the engine's logprobs is 1
    assert logs[0]["ratio"] == pytest.approx(1.0, abs=1e-2) and logs[0]["kl"] < 1e-2, logs[0]
    metrics = [h for h in trainer.state.log_history if "sample/staleness_max" in h]
    assert metrics and all(m["sample/staleness_max"] <= 1 for m in metrics)
    assert all(m.get("sample/dropped_stale_total", 0) == 0 for m in trainer.state.log_history)
    assert any(h.get("agentloop/groups_total") for h in trainer.state.log_history)  # our metrics reached its logs
