"""TRL's ``rollout_func`` played by an agent of the user's own (``AgentLoopRollout(agent=...)``): each prompt a
session of the session gateway served over the manager's Router, played by an unmodified agent (the real
``openai`` SDK) against a scripted fake engine server in this process; TRL gets one completion per prompt, the
session's main chain, token for token, and the chains an agent forked are counted, not trained on."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from agentloop_grpc.agent import WorkerSpec
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.integrations.external_agent import ExternalAgent
from agentloop_grpc.integrations.gateway_player import AgentConfigError
from agentloop_grpc.integrations.trl.rollout import AgentLoopRollout

from ..agent.conftest import TextScript, call, scripted_engine
from ..rollout.external_agent import PATH

ANSWER = "The answer is 5."
ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "ground_truth": "5"},
    {"id": "b", "messages": [{"role": "user", "content": "What is 4 + 4?"}], "ground_truth": "8"},
]


def _reply(text: str) -> str:
    """The scripted model: a calculator call first when tools are offered, then the answer."""
    first = text.count("<|im_start|>assistant") == 1
    return call("calculator", expression="2+3") if first and "calculator" in text else ANSWER


async def forking_agent(base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> None:
    """Asks the row's question, then a question of its own in a fresh conversation: the session forks."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=row["messages"])
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "And 1 + 1?"}])


@pytest.fixture(scope="module")
async def engine():
    async with scripted_engine(TextScript(load_codec(None), _reply)) as address:
        yield address


def _trainer(step: int = 0) -> SimpleNamespace:
    """What ``rollout_func`` reads of TRL's GRPOTrainer (the full trainer: tests/integrations/test_trl_grpo.py)."""
    return SimpleNamespace(model=SimpleNamespace(training=True), num_generations=2, num_generations_eval=2,
                           state=SimpleNamespace(global_step=step))


async def _step(engine: str, agent: ExternalAgent) -> tuple[dict[str, list], Any]:
    """One rollout_func call on both rows, two generations each (TRL's RepeatSampler order): TRL's fields and the
    step's record."""
    rollout = AgentLoopRollout(WorkerSpec(engines=(engine,)), ROWS, agent=agent, check_logprobs=0)
    prompts = [ROWS[0]["messages"]] * 2 + [ROWS[1]["messages"]] * 2
    try:
        fields = await asyncio.to_thread(rollout, prompts, _trainer())
    finally:
        await asyncio.to_thread(rollout.close)
    (record,) = rollout.history
    return fields, record


async def test_an_unmodified_agent_plays_trl_rollouts_token_for_token(engine):
    agent = ExternalAgent(callable=f"{PATH}:tool_agent", gateway={"sampling": {"temperature": 0.0}})
    fields, record = await _step(engine, agent)
    trajectories = record.trajectories
    assert [t.sample_id for t in trajectories] == ["s0.0/0/0", "s0.0/0/1", "s0.0/1/0", "s0.0/1/1"]
    assert [t.group_id for t in trajectories] == ["s0.0/0"] * 2 + ["s0.0/1"] * 2
    assert not any(t.failed for t in trajectories) and record.metrics["forked_chains"] == 0.0
    # the agent posted 1.0 for an answer holding the ground truth (5), 0.25 otherwise (8)
    assert fields["agentloop_reward"] == [1.0, 1.0, 0.25, 0.25]
    codec = load_codec(None)
    for t, completion, mask, logprobs in zip(trajectories, fields["completion_ids"], fields["env_mask"],
                                             fields["logprobs"], strict=True):
        assert completion == list(t.response_ids) and mask == list(t.response_mask)
        assert logprobs == list(t.response_logprobs)
        model = codec.decode([i for i, m in zip(t.response_ids, t.response_mask, strict=True) if m])
        assert json.dumps({"name": "calculator", "arguments": {"expression": "2+3"}}) in model and ANSWER in model
        assert 0 in mask  # the tool's answer, which the agent ran itself, is not the model's


async def test_the_chains_an_agent_forks_are_counted_and_one_completion_per_prompt_remains(engine):
    fields, record = await _step(engine, ExternalAgent(callable=f"{__name__}:forking_agent"))
    assert len(fields["completion_ids"]) == 4 and record.metrics["forked_chains"] == 4.0
    assert fields["agentloop_sample_id"] == ["s0.0/0/0", "s0.0/0/1", "s0.0/1/0", "s0.0/1/1"]
    codec = load_codec(None)
    assert all("2 + 3" in codec.decode(t.prompt_ids) for t in record.trajectories[:2])  # the main chains


async def test_trajectory_selection_chooses_the_chain_a_trainer_gets(engine):
    agent = ExternalAgent(callable=f"{__name__}:forking_agent", trajectory_selection="last")
    fields, record = await _step(engine, agent)
    assert len(fields["completion_ids"]) == 4 and record.metrics["forked_chains"] == 0.0  # the session kept one
    codec = load_codec(None)
    assert all("1 + 1" in codec.decode(t.prompt_ids) for t in record.trajectories)  # the last chain, each time


def test_the_gateway_samples_as_the_trainer_assumes_unless_told_otherwise():
    spec = WorkerSpec(engines=("127.0.0.1:1",), loop={"sampling": {"temperature": 0.7}})
    agent = ExternalAgent(callable=f"{PATH}:tool_agent")
    assert AgentLoopRollout(spec, ROWS, agent=agent).agent.gateway.sampling.temperature == 0.7
    assert AgentLoopRollout(spec, ROWS, agent=agent).agent.gateway.sampling.top_p == 1.0
    forced = ExternalAgent(callable=f"{PATH}:tool_agent", gateway={"sampling": {"temperature": 0.0}})
    assert AgentLoopRollout(spec, ROWS, agent=forced).agent.gateway.sampling.temperature == 0.0
    with pytest.raises(ValueError, match=r"agent.reward: function scores with spec.reward"):
        AgentLoopRollout(spec, ROWS, agent=ExternalAgent(callable=f"{PATH}:tool_agent", reward="function"))


def test_an_agent_that_cannot_run_is_refused_before_anything_starts():
    with pytest.raises(AgentConfigError, match=r"agent\.callable: tests\.rollout\.nowhere:agent cannot be imported"):
        AgentLoopRollout(WorkerSpec(engines=("127.0.0.1:1",)), ROWS,
                         agent=ExternalAgent(callable="tests.rollout.nowhere:agent"))


async def test_an_agent_plays_the_groups_of_fully_async_training(engine):
    """``AsyncAgentLoopRollout(agent=...)``: the stream's groups are the agent's sessions, the same fields."""
    from agentloop_grpc.integrations.trl import AsyncAgentLoopRollout

    agent = ExternalAgent(callable=f"{PATH}:tool_agent", gateway={"sampling": {"temperature": 0.0}})
    rollout = AsyncAgentLoopRollout(WorkerSpec(engines=(engine,)), ROWS, agent=agent, check_logprobs=0,
                                    max_staleness=1)
    try:
        steps = [await asyncio.to_thread(rollout, [ROWS[0]["messages"]] * 2, _trainer(step)) for step in (0, 1)]
    finally:
        await asyncio.to_thread(rollout.close)
    assert [[t.sample_id for t in r.trajectories] for r in rollout.history] == [["a0/0", "a0/1"], ["a1/0", "a1/1"]]
    assert {tuple(r["agentloop_reward"]) for r in steps} <= {(1.0, 1.0), (0.25, 0.25)}  # posted by the agent
    for record, fields in zip(rollout.history, steps, strict=True):
        assert not any(t.failed for t in record.trajectories) and record.metrics["forked_chains"] == 0.0
        assert "staleness_max" in record.metrics
        assert [list(t.response_ids) for t in record.trajectories] == fields["completion_ids"]
        assert all(0 in mask and 1 in mask for mask in fields["env_mask"])  # the agent's tool turn is not the model's
