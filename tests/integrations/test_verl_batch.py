"""Our trajectories as verl's agent-loop DataProto, and verl's own GRPO advantage and PPO policy loss on it (verl
0.9.1 running for real): every field verl's trainer reads is there, and the masks cover exactly the model tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn

from agentloop_grpc.agent import Sample, Termination
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.integrations.verl.batch import TENSORS, FailedTrajectoriesError, to_dataproto

from ..agent.conftest import call, loop_context

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)


async def _trajectories():
    codec = load_codec(None)
    replies = [call("calculator", expression="2+3"), "The answer is 5."]
    async with loop_context(codec, replies) as (_ctx, loops, _script):
        runs = [await loops.get("tool").run(Sample(sample_id=f"q{g}/{i}", group_id=f"q{g}", messages=QUESTION,
                                                   tools=("calculator",)))
                for g in range(2) for i in range(2)]
        single = await loops.get("single_turn").run(Sample(sample_id="q2/0", group_id="q2", messages=QUESTION))
    # rewards are inputs here: one right and one wrong answer per tool group, so GRPO has something to compare
    rewards = [1.0, 0.0, 0.0, 1.0]
    return [dataclasses.replace(t, reward=r) for t, r in zip(runs, rewards)] + [single], codec


async def test_trajectories_become_the_dataproto_verls_trainer_reads() -> None:
    trajectories, codec = await _trajectories()
    data = to_dataproto(trajectories, pad_token_id=codec.tokenizer.pad_token_id or 0)
    assert set(TENSORS) <= set(data.batch.keys()) and len(data) == len(trajectories)
    p, r = data.batch["prompts"].size(1), data.batch["responses"].size(1)
    assert data.batch["input_ids"].shape == (len(trajectories), p + r)
    for i, t in enumerate(trajectories):
        n = len(t.response_ids)
        assert data.batch["response_mask"][i, :n].tolist() == list(t.response_mask)  # model tokens, exactly
        assert not data.batch["response_mask"][i, n:].any()
        assert data.batch["responses"][i, :n].tolist() == list(t.response_ids)
        assert data.batch["prompts"][i, p - len(t.prompt_ids):].tolist() == list(t.prompt_ids)
        assert data.batch["rollout_log_probs"][i, :n].tolist() == pytest.approx(list(t.response_logprobs))
        assert data.batch["rm_scores"][i].sum().item() == t.reward
        assert data.batch["rm_scores"][i, n - 1].item() == t.reward  # on the last response token, as verl's loops
    assert list(data.non_tensor_batch["uid"]) == ["q0", "q0", "q1", "q1", "q2"]
    # verl counts the prompt, each assistant turn and each turn of tool responses
    assert list(data.non_tensor_batch["__num_turns__"]) == [4, 4, 4, 4, 2]
    assert list(data.non_tensor_batch["tool_call_counts"]) == [1, 1, 1, 1, 0]
    assert list(data.non_tensor_batch["multi_modal_inputs"]) == [{}] * len(trajectories)  # the trainer iterates it
    for key in ("turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras"):
        assert len(data.non_tensor_batch[key]) == len(trajectories)
    assert len(data.meta_info["metrics"]) == len(trajectories) and data.meta_info["reward_extra_keys"] == []
    assert 0 in set(data.batch["response_mask"][0].tolist())  # a tool response lies inside the tool trajectory


async def test_verls_grpo_advantage_and_policy_loss_run_on_it() -> None:
    trajectories, codec = await _trajectories()
    data = to_dataproto(trajectories, pad_token_id=codec.tokenizer.pad_token_id or 0)
    mask = data.batch["response_mask"]
    advantages, _returns = compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["rm_scores"], response_mask=mask, index=data.non_tensor_batch["uid"],
    )
    assert not advantages[mask == 0].any()  # nothing is credited to tool or padding tokens
    per_trajectory = [advantages[i][mask[i] == 1].unique().tolist() for i in range(len(data))]
    assert per_trajectory[0][0] > 0 > per_trajectory[1][0]  # within q0: the rewarded one is pushed up
    assert per_trajectory[0][0] == pytest.approx(-per_trajectory[1][0])
    assert per_trajectory[4] == [0.0]  # a group of one has nothing to compare with
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                              "loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"},
                              "global_batch_info": {"dp_size": 1, "batch_num_tokens": int(mask.sum()),
                                                    "global_batch_size": len(data)}})
    old = data.batch["rollout_log_probs"]
    loss, metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=old + 0.01 * mask, advantages=advantages, response_mask=mask,
        loss_agg_mode="token-mean", config=actor,
    )
    assert torch.isfinite(loss) and np.isfinite(float(loss))
    assert isinstance(metrics, dict)


async def test_input_columns_and_reward_extra_info_are_carried_and_failures_refused() -> None:
    trajectories, codec = await _trajectories()
    pad = codec.tokenizer.pad_token_id or 0
    columns = {"data_source": np.array(["gsm8k"] * len(trajectories), dtype=object),
               "uid": np.array([0, 0, 1, 1, 2])}  # a trainer's uid of another type than our group ids
    extra = [{"acc": t.reward} for t in trajectories]
    data = to_dataproto(trajectories, pad, columns=columns, reward_extra=extra)
    assert list(data.non_tensor_batch["data_source"]) == ["gsm8k"] * len(trajectories)
    assert data.non_tensor_batch["uid"] is columns["uid"]
    assert list(data.non_tensor_batch["acc"]) == [t.reward for t in trajectories]
    assert data.meta_info["reward_extra_keys"] == ["acc"]
    with pytest.raises(ValueError, match="reward_extra\\[1\\] has keys"):
        to_dataproto(trajectories, pad, reward_extra=[{"acc": 1.0}] + [{}] * (len(trajectories) - 1))
    broken = dataclasses.replace(trajectories[1], termination=Termination.ERROR, error="engine gone",
                                 infrastructure_failure=True)
    with pytest.raises(FailedTrajectoriesError, match=r"1 of 5 trajectories failed.*q0/1: engine gone") as failed:
        to_dataproto([trajectories[0], broken, *trajectories[2:]], pad)
    assert failed.value.failures == (("q0/1", "engine gone"),)


async def test_routed_experts_reach_verls_router_replay_aligned_with_each_rows_tokens() -> None:
    """verl's R3 unpads ``routed_experts`` with ``input_ids`` (left_right_2_no_padding, before its actor's forward):
    each row's routing must come out beside its own tokens, position for position."""
    from omegaconf import OmegaConf
    from verl.workers.utils.padding import left_right_2_no_padding

    from agentloop_grpc.common.routed_experts import Routing, pack
    from agentloop_grpc.integrations.verl.manager import LoopSettings, loop_config

    trajectories, codec = await _trajectories()
    rng = np.random.default_rng(0)
    layers, top_k, experts = 3, 2, 8
    routed = []
    for t in trajectories:
        ids = rng.integers(0, experts, (len(t.prompt_ids) + len(t.response_ids) - 1, layers, top_k))
        routed.append(dataclasses.replace(t, routed_experts=Routing(layers, top_k, experts, pack(ids, experts))))
    data = to_dataproto(routed, pad_token_id=codec.tokenizer.pad_token_id or 0)
    assert data.batch["routed_experts"].dtype == torch.int16
    assert data.batch["routed_experts"].shape[:2] == data.batch["input_ids"].shape
    unpadded = left_right_2_no_padding(data.batch.clone())
    for t, tokens, routes in zip(routed, unpadded["input_ids"].unbind(), unpadded["routed_experts"].unbind()):
        assert tokens.tolist() == list(t.prompt_ids) + list(t.response_ids)
        assert t.routed_experts is not None
        np.testing.assert_array_equal(routes[:-1].numpy(), t.routed_experts.array())
        assert not routes[-1].any()  # the last token is never an input: verl's filler, which its replay skips
    with pytest.raises(ValueError, match="1 of 5 trajectories carry routed experts"):
        to_dataproto([routed[0], *trajectories[1:]], pad_token_id=0)
    rollout = OmegaConf.create({"prompt_length": 64, "response_length": 64, "enable_rollout_routing_replay": True})
    assert loop_config(rollout, LoopSettings(), validate=False).return_routed_experts
    rollout.enable_rollout_routing_replay = False
    assert not loop_config(rollout, LoopSettings(), validate=False).return_routed_experts
