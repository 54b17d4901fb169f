"""``dataset.reasoning_gym``: reasoning-gym's tasks as rows, scored by the task's own scorer.

The rows are deterministic in the seed and name their entry; through the real rollout path (``run_rollout``) and
TRL's rollout functions (sync and fully-async, built from the spec ``agentloop train`` builds) against a scripted
fake engine, a reply with the right answer between the tags earns 1.0, a wrong one less, and one without the tags
nothing, even when the prompt's worked examples hold tagged answers. A task or config reasoning-gym refuses is a
config error naming its field, found when the config loads (before any server starts).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import reasoning_gym
from pydantic import ValidationError
from rich.console import Console

from agentloop_grpc.agent import Sample
from agentloop_grpc.agent.reward import Outcome
from agentloop_grpc.agent.spec import ComponentSpec, load_codec
from agentloop_grpc.agent.trajectory import Termination
from agentloop_grpc.common.config_errors import describe
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.dataset import read_rows
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.reasoning_gym_reward import PATH, ReasoningGymReward
from agentloop_grpc.rollout.run import RunRecord, run_rollout
from agentloop_grpc.train.config import TrainConfig

from ..agent.conftest import TextScript, scripted_engine

ROOT = Path(__file__).resolve().parents[2]
TASK_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
               "allow_parentheses": False, "allow_negation": False}
SOURCE = {"task": "basic_arithmetic", "size": 3, "seed": 5, "shots": 1, "config": TASK_CONFIG}
#: The problems of SOURCE as reasoning-gym itself generates them (not through our code).
ENTRIES = [reasoning_gym.create_dataset("basic_arithmetic", size=3, seed=5, **TASK_CONFIG)[i] for i in range(3)]


def _document(tmp_path: Path, source: dict[str, Any] = SOURCE, **overrides: Any) -> dict[str, Any]:
    """A rollout or train config (their shared fields) on ``source``."""
    return {"engines": {"addresses": ["127.0.0.1:1"]}, "tools": {"launch": None},
            "dataset": {"reasoning_gym": source}, "output_dir": str(tmp_path / "out"),
            "router": {"no_server_wait_s": 5}, **overrides}


def _wrong(answer: str) -> str:
    return str(int(answer) + 1)


def _replies() -> dict[str, tuple[str, float]]:
    """The scripted model's reply to each question and the reward the task's scorer gives it: the right answer
    between the tags, a wrong one between them, and the right one without them (no answer: 0)."""
    first, second, third = ENTRIES
    return {
        first["question"]: (f"<answer>{first['answer']}</answer>", 1.0),
        second["question"]: (f"Let me see. <answer>{_wrong(second['answer'])}</answer>", 0.0),
        third["question"]: (f"It is {third['answer']}.", 0.0),
    }


def _reply(text: str) -> str:
    """The reply to the last question of the prompt (the worked example's question comes before it)."""
    question = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    return _replies()[question][0]


@pytest.fixture(scope="module")
async def engine():
    async with scripted_engine(TextScript(load_codec(None), _reply)) as address:
        yield address


def _expected(trajectory) -> float:
    question = next(m["content"] for m in reversed(trajectory.messages) if m["role"] == "user")
    return _replies()[question][1]


def test_rows_are_deterministic_in_the_seed_and_name_their_entry(tmp_path):
    def rows(seed: int) -> list[dict]:
        return read_rows(RolloutConfig.model_validate(_document(tmp_path, {**SOURCE, "seed": seed})).dataset)

    first = rows(5)
    assert first == rows(5) and first != rows(6)
    assert [row["messages"][-1]["content"] for row in first] == [e["question"] for e in ENTRIES]
    assert all(row["loop"] == "single_turn" for row in first)
    for index, row in enumerate(first):
        named = json.loads(row["ground_truth"])
        assert named == {"task": "basic_arithmetic", "size": 3, "seed": 5, "config": TASK_CONFIG, "index": index,
                         "answer": ENTRIES[index]["answer"]}
    # one worked example, the same in every row, answered between the tags and none of the rows' own problems
    system, shot, answer, _ = first[0]["messages"]
    assert system["role"] == "system" and "<answer>" in system["content"]
    assert shot["role"] == "user" and answer == {"role": "assistant", "content": answer["content"]}
    assert answer["content"].startswith("<answer>") and shot["content"] not in {e["question"] for e in ENTRIES}
    assert all(row["messages"][:3] == first[0]["messages"][:3] for row in first)


def test_a_repeated_question_is_one_row(tmp_path):
    # one digit, one operation, two terms: 100 possible problems, so 150 entries repeat some
    source = {"task": "basic_arithmetic", "size": 150, "config": {**TASK_CONFIG, "operators": ["+"]}}
    rows = read_rows(RolloutConfig.model_validate(_document(tmp_path, source)).dataset)
    questions = [row["messages"][-1]["content"] for row in rows]
    assert len(set(questions)) == len(questions) < 150


async def test_the_tasks_scorer_is_the_reward_of_a_rollout(tmp_path, engine):
    config = RolloutConfig.model_validate(_document(tmp_path, engines={"addresses": [engine]}, samples_per_prompt=2,
                                                    report=False, trace=False))
    assert config.reward_function == ComponentSpec(path=PATH)
    record = await run_rollout(config, Progress(Console(file=io.StringIO())), RunRecord(output_dir=tmp_path / "out"))
    assert len(record.trajectories) == 6 and not any(t.failed for t in record.trajectories)
    assert [t.reward for t in record.trajectories] == [_expected(t) for t in record.trajectories]
    assert [t.reward for t in record.trajectories] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [t.metrics["answer_tagged"] for t in record.trajectories] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["correct_answers_rate"] == round(1 / 3, 4)


def _trainer(step: int) -> SimpleNamespace:
    """What ``rollout_func`` reads of TRL's GRPOTrainer (the full trainer: tests/integrations/test_trl_grpo.py)."""
    return SimpleNamespace(model=SimpleNamespace(training=True), num_generations=2, num_generations_eval=2,
                           state=SimpleNamespace(global_step=step))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_tasks_scorer_is_the_reward_of_training(tmp_path, engine, mode):
    from agentloop_grpc.integrations.trl import AgentLoopRollout, AsyncAgentLoopRollout
    from agentloop_grpc.train.run import worker_spec

    config = TrainConfig.model_validate({**_document(tmp_path), "mode": mode})
    rows = read_rows(config.dataset)
    spec = worker_spec(config, [engine], None, None)
    assert spec.reward == ComponentSpec(path=PATH)
    kind = AsyncAgentLoopRollout if mode == "async" else AgentLoopRollout
    rollout = kind(spec, rows, default_loop=config.dataset.default_loop, check_logprobs=0)
    prompts = [row["messages"] for row in rows for _ in range(2)]  # TRL's order: each prompt num_generations times
    try:
        fields = await asyncio.to_thread(rollout, prompts, _trainer(0))
    finally:
        await asyncio.to_thread(rollout.close)
    (record,) = rollout.history
    assert len(record.trajectories) == 6 and not any(t.failed for t in record.trajectories)
    assert fields["agentloop_reward"] == [_expected(t) for t in record.trajectories]
    assert sorted(fields["agentloop_reward"]) == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def _outcome(truth: str, reply: str) -> Outcome:
    sample = Sample(sample_id="s", messages=({"role": "user", "content": "q"},), ground_truth=truth)
    return Outcome(sample=sample, messages=(*sample.messages, {"role": "assistant", "content": reply}),
                   termination=Termination.STOP, tool_instance_rewards={}, tool_step_rewards=(),
                   interaction_score=None, response_ids=())


def test_the_reward_gives_partial_credit_as_the_task_does_and_refuses_a_foreign_entry(tmp_path):
    (row, *_) = read_rows(RolloutConfig.model_validate(_document(tmp_path)).dataset)
    reward = ReasoningGymReward()
    answer = ENTRIES[0]["answer"]
    # reasoning-gym's default scorer: an answer that holds the truth earns len(truth) / len(answer)
    partial = reward(_outcome(row["ground_truth"], f"<answer>{answer} or so</answer>"))
    assert partial.reward == pytest.approx(len(answer) / len(f"{answer} or so")) and 0 < partial.reward < 1
    named = {**json.loads(row["ground_truth"]), "answer": _wrong(answer)}
    with pytest.raises(ValueError, match="another reasoning-gym version built the rows"):
        reward(_outcome(json.dumps(named), f"<answer>{answer}</answer>"))
    with pytest.raises(ValueError, match="names no reasoning-gym entry"):
        reward(_outcome("42", "<answer>42</answer>"))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"task": "leg_countin"},
         "dataset.reasoning_gym.task: reasoning-gym has no task 'leg_countin' (did you mean leg_counting"),
        ({"task": "leg_counting", "config": {"max_legs": 3}},
         "dataset.reasoning_gym.config: LegCountingConfig has no field 'max_legs'; its fields: max_animals, "
         "max_instances, min_animals, min_instances"),
        ({"task": "leg_counting", "config": {"min_animals": 0}},
         "dataset.reasoning_gym.config: reasoning-gym refused it for leg_counting (AssertionError: min_animals "
         "must be positive)"),
        # passes the task's own checks; fails when an entry is generated
        ({"task": "simple_equations", "config": {"operators": ["+"]}},
         "dataset.reasoning_gym.config: reasoning-gym refused it for simple_equations (ValueError: The number of "
         "weights does not match the population)"),
        ({"task": "leg_counting", "config": {"seed": 3}},
         "dataset.reasoning_gym.config: 'seed' is set by dataset.reasoning_gym.seed, not inside config"),
    ],
    ids=["task", "unknown-field", "bad-value", "fails-generating", "own-field"],
)
@pytest.mark.parametrize("model", [RolloutConfig, TrainConfig])
def test_a_task_or_config_reasoning_gym_refuses_is_a_config_error_naming_the_field(tmp_path, source, expected,
                                                                                    model):
    with pytest.raises(ValidationError) as raised:
        model.model_validate(_document(tmp_path, source))
    message = describe("run.yaml", raised.value, model)
    assert message.startswith(f"run.yaml: {expected}"), message


def test_without_the_package_the_config_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)  # what importing a missing package raises
    with pytest.raises(ValidationError) as raised:
        RolloutConfig.model_validate(_document(tmp_path))
    assert describe("run.yaml", raised.value, RolloutConfig).startswith(
        "run.yaml: dataset.reasoning_gym.task: needs `pip install 'agentloop-grpc[reasoning-gym]'`")


def test_too_few_problems_for_the_worked_examples_is_a_dataset_error(tmp_path):
    from agentloop_grpc.rollout.dataset import DatasetError

    # one digit, "+": 100 problems, all of them rows, none left to show
    source = {**SOURCE, "size": 2000, "shots": 1, "config": {**TASK_CONFIG, "operators": ["+"]}}
    with pytest.raises(DatasetError, match=r"dataset\.reasoning_gym\.shots: basic_arithmetic under this config has "
                       "too few distinct problems"):
        read_rows(RolloutConfig.model_validate(_document(tmp_path, source)).dataset)


def test_reasoning_gym_is_imported_only_by_the_source():
    program = ("import sys; from agentloop_grpc.rollout.config import load_config; "
               "from agentloop_grpc.rollout.dataset import read_rows; import agentloop_grpc.rollout.run; "
               "read_rows(load_config('examples/demo.yaml').dataset); print('reasoning_gym' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr
