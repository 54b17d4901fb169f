"""TRL's GRPOTrainer learning from our rollouts on the real default model: weights change, engines take them with
the step as their version, tokens made after a push carry it and their logprobs equal the trainer's recompute,
and trajectories that failed for infrastructure reasons never reach the loss (in fully-async mode too)."""

from __future__ import annotations

import pytest
import torch

from agentloop_grpc.agent import AgentLoopConfig, SamplingConfig, Termination, Trajectory, WorkerSpec
from agentloop_grpc.integrations.logprob_check import recompute_logprobs
from agentloop_grpc.integrations.trl import (
    AgentLoopRollout,
    AsyncAgentLoopRollout,
    WeightSyncCallback,
    agentloop_reward,
    prompt_dataset,
    trl_fields,
)
from agentloop_grpc.rollout.arithmetic import dataset_rows

pytestmark = pytest.mark.slow

ROWS = dataset_rows(2, 0, "one_step", "+", 20)
LOOP = AgentLoopConfig(
    constrain_tool_calls=True, max_assistant_turns=2, max_parallel_tool_calls=1, max_new_tokens_per_turn=32,
    response_budget=160, drift_check="off", sampling=SamplingConfig(temperature=1.0, seed=0),
)


def position_in_group(completion_ids, **kwargs) -> list[float | None]:
    """A second reward that differs within every group (0, 1, ...), so every step has a gradient whatever the
    untrained model wrote (the test's, not ours)."""
    return [float(i % 2) for i in range(len(completion_ids))]


def grpo_config(tmp_path, max_steps: int):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, gradient_accumulation_steps=1,
        max_steps=max_steps, learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0, temperature=1.0, seed=0,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False,
        disable_tqdm=True,
    )


def test_two_grpo_steps_move_the_trainer_and_the_engines_together(own_servers, model, tmp_path):
    from trl import GRPOTrainer

    engine, tools, _, _ = own_servers
    model, tokenizer = model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    spec = WorkerSpec(engines=(engine,), tool_server=tools, loop=LOOP)
    with AgentLoopRollout(spec, ROWS, check_logprobs=4) as rollout:
        sync = WeightSyncCallback(rollout)
        trainer = GRPOTrainer(
            model=model, reward_funcs=[agentloop_reward, position_in_group], args=grpo_config(tmp_path, 2),
            train_dataset=prompt_dataset(ROWS), processing_class=tokenizer, rollout_func=rollout, callbacks=[sync],
        )
        trainer.train()
        base = rollout.base_version  # 0 on a fresh engine
        assert rollout.engine_versions() == {engine: base + 2}
        # one more rollout on the final weights (version 2), as the next step would make
        prompts = [ROWS[0]["messages"]] * 2
        fields = rollout(prompts, trainer)

    changed = [n for n, p in model.named_parameters() if n in before and not torch.equal(before[n], p)]
    assert changed, "the trainer's weights did not change"
    assert set(sync.sync_s) == {1, 2} and all(s > 0 for s in sync.sync_s.values())
    steps = rollout.history
    assert [s.step for s in steps] == [0, 1, 2]
    for record in steps:
        versions = {v for t in record.trajectories for v, m in zip(t.weight_versions, t.response_mask) if m}
        assert versions == {base + record.step}, (record.step, versions)  # all made by the step's weights
        assert record.metrics["stale_tokens"] == 0
        assert record.metrics["logprob_diff_sampler_tokens"] > 0
        assert record.metrics["logprob_diff_sampler_max"] < 2e-3, (record.step, record.metrics)
    # the last rollout against the trainer's final weights, token by token, with the grammar replayed
    last = [t for t in steps[-1].trajectories if not t.failed]
    assert rollout._grammars is not None  # the rollout replays constrained calls in its logprob check
    grammar = rollout._grammars(("calculator", "check_answer"))
    model.eval()
    for t in last:
        recomputed = recompute_logprobs(model, t, 1.0, grammar if t.constrained else None)
        recorded = [lp for lp, m in zip(t.response_logprobs, t.response_mask, strict=True) if m]
        assert max(abs(a - b) for a, b in zip(recorded, recomputed, strict=True)) < 2e-3
    # what TRL got: one row per trajectory, completion, mask and logprobs aligned, our mask as its env_mask
    for i, t in enumerate(steps[-1].trajectories):
        assert fields["completion_ids"][i] == list(t.response_ids)
        assert fields["env_mask"][i] == list(t.response_mask)
        assert len(fields["logprobs"][i]) == len(t.response_ids)
        assert fields["prompt_ids"][i] == list(t.prompt_ids)


def _trajectory(sample_id: str, reward: float, failed: bool = False) -> Trajectory:
    return Trajectory(
        sample_id=sample_id, loop="tool", group_id="g", prompt_ids=(1, 2, 3), response_ids=(40, 41, 2, 50, 51),
        response_mask=(1, 1, 1, 0, 0), response_logprobs=(-1.0, -1.0, -1.0, 0.0, 0.0),
        weight_versions=(0, 0, 0, -1, -1), reward=0.0 if failed else reward,
        termination=Termination.ERROR if failed else Termination.STOP,
        error="engine server went away" if failed else None, infrastructure_failure=failed,
    )


def test_an_infrastructure_failure_never_reaches_the_loss(model, tmp_path):
    """TRL's own scoring of a group where one trajectory failed: no advantage, no loss tokens for it, and it does
    not drag its group's baseline (the other trajectory's advantage is 0 too, not positive)."""
    from trl import GRPOTrainer

    model, tokenizer = model
    outputs = [_trajectory("ok", 1.0), _trajectory("broken", 0.0, failed=True)]

    def rollout_func(prompts, trainer):
        return trl_fields(outputs, tokenizer.pad_token_id)

    trainer = GRPOTrainer(
        model=model, reward_funcs=[agentloop_reward], args=grpo_config(tmp_path, 1),
        train_dataset=prompt_dataset(ROWS), processing_class=tokenizer, rollout_func=rollout_func,
    )
    inputs = [{"prompt": ROWS[0]["messages"]}, {"prompt": ROWS[0]["messages"]}]
    scored = trainer._generate_and_score_completions(inputs)
    assert scored["advantages"].tolist() == [0.0, 0.0]
    assert scored["tool_mask"][1].sum().item() == 0  # TRL's loss mask = completion mask x this
    assert scored["tool_mask"][0].tolist() == [1, 1, 1, 0, 0]


@pytest.mark.parametrize("rollout_class", [AgentLoopRollout, AsyncAgentLoopRollout])
def test_a_dead_tool_server_mid_run_fails_trajectories_as_infrastructure(own_servers, model, tmp_path,
                                                                           rollout_class):
    from trl import GRPOTrainer

    from agentloop_grpc.tools.config import load_config
    from agentloop_grpc.tools.server import create_tool_server

    engine, _, loop, _ = own_servers
    from importlib import resources

    doomed = loop.run(create_tool_server(load_config(resources.files("agentloop_grpc.tools") / "builtin.yaml")))
    model, tokenizer = model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    # greedy: the untrained model then completes its first call (~30 tokens), which reaches the dead server
    greedy = LOOP.model_copy(update={"sampling": SamplingConfig(temperature=0.0), "max_new_tokens_per_turn": 64})
    spec = WorkerSpec(engines=(engine,), tool_server=f"127.0.0.1:{doomed.port}", loop=greedy)
    with rollout_class(spec, ROWS, check_logprobs=0) as rollout:
        loop.run(doomed.stop(grace_s=0))  # started fine, gone before the first rollout
        trainer = GRPOTrainer(
            model=model, reward_funcs=[agentloop_reward, position_in_group], args=grpo_config(tmp_path, 1),
            train_dataset=prompt_dataset(ROWS), processing_class=tokenizer, rollout_func=rollout,
            callbacks=[WeightSyncCallback(rollout)],
        )
        trainer.train()
    [record] = rollout.history
    causes = [(t.termination, t.error) for t in record.trajectories]
    assert all(t.failed and t.infrastructure_failure for t in record.trajectories), causes
    assert record.metrics["infrastructure_failures"] == 2
    # no tokens in the loss: position_in_group would have moved the weights had any been trained on
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)
