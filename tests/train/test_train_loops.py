"""`agentloop train` runs the loops its config names: rows that name none run ``dataset.default_loop`` (TRL's
rollout once ran the built-in tool loop whatever the config said), a row naming a loop no worker has is refused
when the rollout is made, and the training config checks its loops with the rollout config's own rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentloop_grpc.agent import WorkerSpec
from agentloop_grpc.agent.spec import ComponentSpec
from agentloop_grpc.integrations.trl.rollout import AgentLoopRollout
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.train.config import TrainConfig

from ..agent.custom_loops import PATH as REVISE

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 1 + 2?"}]},
    {"id": "b", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "loop": "tool"},
]
SPEC = WorkerSpec(engines=("127.0.0.1:1",), loops={"revise": ComponentSpec(path=REVISE)})


def test_rows_that_name_no_loop_run_the_default_loop():
    rollout = AgentLoopRollout(SPEC, ROWS, default_loop="revise")
    samples = rollout.samples([ROWS[0]["messages"]] * 2 + [ROWS[1]["messages"]] * 2, group_size=2, prefix="s0")
    assert [s.loop for s in samples] == ["revise", "revise", "tool", "tool"]


def test_a_row_naming_a_loop_no_worker_has_is_refused_when_the_rollout_is_made():
    rows = [*ROWS, {"id": "c", "messages": [{"role": "user", "content": "Hi"}], "loop": "revize"}]
    with pytest.raises(ValueError, match=r"no loop named 'revize' \(row c\); known: \['revise', 'single_turn', "
                       r"'tool'\]"):
        AgentLoopRollout(SPEC, rows)


BASE = {"engines": {"addresses": ["127.0.0.1:1"]}, "dataset": {"arithmetic": {"count": 2}}}


@pytest.mark.parametrize("config", [RolloutConfig, TrainConfig])
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"dataset": {"arithmetic": {"count": 2}, "default_loop": "nope"}},
         "dataset.default_loop: no loop named 'nope'; known: ['single_turn', 'tool'] (add yours under loops)"),
        ({"loops": {"tool": {"path": REVISE}}}, "['tool'] are built-in loop names; give your loops other names"),
    ],
    ids=["unknown-default-loop", "built-in-name"],
)
def test_both_configs_refuse_the_same_loops(config, fields, expected):
    with pytest.raises(ValidationError) as raised:
        config.model_validate({**BASE, **fields})
    assert expected in str(raised.value)


def test_a_default_loop_under_loops_is_accepted():
    config = TrainConfig.model_validate({**BASE, "dataset": {"arithmetic": {"count": 2}, "default_loop": "revise"},
                                         "loops": {"revise": {"path": REVISE}}})
    assert config.loop_names == ["revise", "single_turn", "tool"]


def test_a_training_agent_scores_by_its_session_the_run_has_no_reward_function():
    agent = {"callable": "my_agents:play"}
    assert TrainConfig.model_validate({**BASE, "agent": agent}).agent.callable == "my_agents:play"
    with pytest.raises(ValidationError, match=r"agent\.reward: function needs a reward function"):
        TrainConfig.model_validate({**BASE, "agent": {**agent, "reward": "function"}})


def test_both_commands_restart_lost_replicas():
    engines = {"launch": {"replicas": 2, "restart_lost": True}}
    assert RolloutConfig.model_validate({**BASE, "engines": engines}).engines.launch.restart_lost
    assert TrainConfig.model_validate({**BASE, "engines": engines}).engines.launch.restart_lost
