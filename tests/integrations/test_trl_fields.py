"""Trajectories -> TRL's rollout_func fields: token-exact, masks and lengths aligned, failures unscorable."""

from __future__ import annotations

import pytest

from agentloop_grpc.agent import Termination, Trajectory, WorkerSpec
from agentloop_grpc.integrations.trl import agentloop_reward, prompt_key, trl_fields
from agentloop_grpc.integrations.trl.rollout import AgentLoopRollout

PAD = 2


def trajectory(sample_id: str, reward: float = 1.0, **overrides) -> Trajectory:
    fields = {
        "sample_id": sample_id, "loop": "tool", "group_id": "g", "prompt_ids": (10, 11, 12),
        "response_ids": (20, 21, 2, 30, 31, 40, 2),  # model turn, tool turn (mask 0), model turn
        "response_mask": (1, 1, 1, 0, 0, 1, 1),
        "response_logprobs": (-0.5, -0.25, -0.125, 0.0, 0.0, -1.0, -0.0625),
        "weight_versions": (3, 3, 3, -1, -1, 3, 3),
        "reward": reward, "termination": Termination.STOP,
    }
    fields.update(overrides)
    return Trajectory(**fields)


def failed(sample_id: str, infrastructure: bool, **overrides) -> Trajectory:
    return trajectory(sample_id, reward=0.0, termination=Termination.ERROR, error="engine gone",
                      infrastructure_failure=infrastructure, **overrides)


def test_fields_are_the_trajectory_token_for_token():
    t = trajectory("a", reward=1.0)
    out = trl_fields([t], PAD)
    assert out["prompt_ids"] == [[10, 11, 12]]
    assert out["completion_ids"] == [list(t.response_ids)]
    assert out["env_mask"] == [list(t.response_mask)]
    assert out["logprobs"] == [list(t.response_logprobs)]
    assert out["agentloop_reward"] == [1.0] and out["agentloop_sample_id"] == ["a"]
    # what TRL requires: one row per trajectory, completion, mask and logprobs of one length
    for key in ("completion_ids", "env_mask", "logprobs"):
        assert len(out[key][0]) == len(t.response_ids)


def test_failed_trajectories_are_unscorable_and_fully_masked():
    partial = failed("infra", True)  # an engine died after two turns: tokens exist, none may be trained on
    empty = failed("bare", False, prompt_ids=(), response_ids=(), response_mask=(), response_logprobs=(),
                   weight_versions=())
    out = trl_fields([trajectory("ok", reward=0.0), partial, empty], PAD)
    assert out["agentloop_reward"] == [0.0, None, None]
    assert out["env_mask"][1] == [0] * len(partial.response_ids)
    assert out["completion_ids"][1] == list(partial.response_ids)
    # TRL needs a non-empty prompt and completion per row: one masked placeholder token
    assert out["prompt_ids"][2] == [PAD] and out["completion_ids"][2] == [PAD] and out["env_mask"][2] == [0]
    assert out["agentloop_infrastructure_failure"] == [False, True, False]
    assert agentloop_reward([None] * 3, agentloop_reward=out["agentloop_reward"]) == [0.0, None, None]


def _rollout(rows) -> AgentLoopRollout:
    return AgentLoopRollout(WorkerSpec(engines=("127.0.0.1:1",)), rows)


R1_PROMPT = [{"role": "user", "content": "What is 1 + 2?"}]
R2_PROMPT = [{"role": "user", "content": "What is 2 + 2?"}]
ROWS: list[dict[str, object]] = [
    {"id": "r1", "messages": R1_PROMPT, "ground_truth": "3", "tools": ["calculator", "check_answer"]},
    {"id": "r2", "messages": R2_PROMPT, "ground_truth": 4},
]


def test_prompts_become_groups_with_the_rows_ground_truth():
    rollout = _rollout(ROWS)
    # what TRL's dataset gives back: missing keys filled with None
    prompts = [[{"role": "user", "content": "What is 1 + 2?", "name": None}]] * 2 + [R2_PROMPT] * 2
    samples = rollout.samples(prompts, group_size=2, prefix="s0.0")
    assert [s.group_id for s in samples] == ["s0.0/0", "s0.0/0", "s0.0/1", "s0.0/1"]
    assert len({s.sample_id for s in samples}) == 4
    assert samples[0].tools_kwargs == {"check_answer": {"ground_truth": "3"}} and samples[0].ground_truth == "3"
    assert samples[0].tools == ("calculator", "check_answer") and samples[2].tools is None
    assert samples[2].ground_truth == "4"


def test_prompts_out_of_group_order_or_unknown_are_refused():
    rollout = _rollout(ROWS)
    with pytest.raises(ValueError, match="num_generations"):
        rollout.samples([R1_PROMPT, R2_PROMPT], group_size=2, prefix="x")
    with pytest.raises(ValueError, match="groups of num_generations=2"):
        rollout.samples([R1_PROMPT] * 3, group_size=2, prefix="x")
    with pytest.raises(KeyError, match="not in the rows"):
        rollout.samples([[{"role": "user", "content": "unknown"}]] * 2, group_size=2, prefix="x")


def test_conflicting_rows_for_one_prompt_are_refused():
    with pytest.raises(ValueError, match="same prompt"):
        _rollout([ROWS[0], {**ROWS[0], "ground_truth": "4"}])
    _rollout([ROWS[0], {**ROWS[0], "id": "r1-again"}])  # the same row twice is fine
    assert prompt_key([{"role": "user", "content": "x", "tool_calls": None}]) == prompt_key(
        [{"content": "x", "role": "user"}])


def test_the_replayed_call_grammar_is_the_runs_tool_call_format() -> None:
    """The trainer's logprob replay masks constrained turns with the grammar the loops used: the run's format's,
    not always Hermes'."""
    from agentloop_grpc.agent import AgentLoopConfig
    from agentloop_grpc.agent.parsers import make_parser
    from agentloop_grpc.integrations.trl.rollout import call_grammar

    tools = [{"type": "function", "function": {"name": "calculator", "description": "math", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    for name in ("hermes", "llama3_json", "qwen3_coder"):
        loop = AgentLoopConfig(tool_parser=name, constrain_tool_calls=True)
        assert call_grammar(loop, tools) == make_parser(name, tools).constraint(tools, loop.max_parallel_tool_calls)
    assert call_grammar(AgentLoopConfig(tool_parser="llama3_json"), tools) != call_grammar(AgentLoopConfig(), tools)
