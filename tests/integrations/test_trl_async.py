"""Fully-async GRPO on the real default model: TRL's GRPOTrainer trains groups that rolled out while it trained
the previous step (``AsyncAgentLoopRollout``), each at most ``max_staleness`` versions behind its weights; the
engines end on the trainer's last weights. An engine of this module's own: it takes pushed weights. TRL's
AsyncGRPOTrainer on the same stream runs end to end in tests/train/test_train_trl_async.py (``trainer: trl_async``)."""

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
