"""`agentloop rollout` on verifiers environments (``dataset: {verifiers: ...}``): the real verifiers 0.4.0, two
environments written here as packages of their own (a single-turn one, and one whose tool is served over MCP by a
``vf.Toolset``), verifiers' own ``null`` harness program (installed by uv from make setup's wheel directory, never
from PyPI), against a scripted fake engine and once against SmolLM2 on the embedded engine.

Each row is a task of the taskset; its trajectory holds the engine's tokens exactly; its reward is the task's own;
a wrong answer is a low reward, while a tool server that dies mid-call or a reward that raises fails the trajectory as
an infrastructure failure that names the cause. What cannot give trajectories of this run is refused before any
server starts.
"""

from __future__ import annotations

import io
import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rich.console import Console

from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.dataset import DatasetError
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.run import LoopConfigError, RunRecord, run_rollout

from ..agent.conftest import EOS, TextScript, call, scripted_engine
from ..agent.test_embedded_rollout import embedded_server  # noqa: F401 - a fixture

pytest.importorskip("verifiers.v1", reason="the verifiers extra (make setup installs it)")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "verifiers"

SINGLE = '''
import verifiers.v1 as vf

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 + 4?", "8"), ("What is 1 + 1?", "2")]


class QuestionData(vf.TaskData):
    answer: str


class QuestionTask(vf.Task[QuestionData]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))


class QuestionsConfig(vf.TasksetConfig):
    questions: int = 3


class Questions(vf.Taskset[QuestionTask, QuestionsConfig]):
    def load(self):
        for prompt, answer in QUESTIONS[: self.config.questions]:
            yield QuestionTask(QuestionData(prompt=prompt, answer=answer), self.config.task)


__all__ = ["Questions"]
'''

TOOLS = '''
import os

import verifiers.v1 as vf

SUMS = [("plain", "Add 2 and 3.", "5", False), ("wrong", "Add 4 and 4.", "8", False),
        ("crash", "Add -1 and 2.", "1", False), ("judge", "Add 1 and 1.", "2", True)]


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        if a < 0:
            os._exit(3)  # the tool server dies mid-call
        return a + b


class SumData(vf.TaskData):
    answer: str
    judge_fails: bool = False


class SumTask(vf.Task[SumData]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        if self.data.judge_fails:
            raise RuntimeError("the judge is unreachable")
        return float(self.data.answer in (trace.last_reply or ""))


class Sums(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for name, prompt, answer, judge_fails in SUMS:
            yield SumTask(SumData(name=name, prompt=prompt, answer=answer, judge_fails=judge_fails), self.config.task)


__all__ = ["Sums"]

if __name__ == "__main__":
    Calculator.run()
'''

TWO_SEATS = '''
import verifiers.v1 as vf
from agentloop_vf_single import Questions


class DuelConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig()
    second: vf.AgentConfig = vf.AgentConfig()


class Duel(vf.Env[DuelConfig]):
    async def run(self, task, agents):
        await agents.first.run(task)


__all__ = ["Duel", "Questions"]
'''

NULL_HARNESS = {"agent": {"harness": {"id": "null"}}}


@pytest.fixture(scope="module", autouse=True)
def environments(tmp_path_factory):
    """The environments as top-level modules, importable here and by the tool servers verifiers starts."""
    root = tmp_path_factory.mktemp("environments")
    for name, source in {"agentloop_vf_single": SINGLE, "agentloop_vf_tools": TOOLS,
                         "agentloop_vf_duel": TWO_SEATS}.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    with pytest.MonkeyPatch.context() as patch:
        for folder in (root, EXAMPLES):
            patch.syspath_prepend(str(folder))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), str(EXAMPLES),
                                                                 os.environ.get("PYTHONPATH")])))
        yield root


@pytest.fixture(scope="module")
def codec():
    return load_codec(None)


def _reply(text: str) -> str:
    """The scripted model: a calc_add call for "Add X and Y", then the sum it read (44 for 4 and 4: a wrong answer);
    "The answer is 5." to any question."""
    asked = re.search(r"Add (-?\d+) and (\d+)", text)
    if asked is None:
        return "The answer is 5."
    if text.count("<|im_start|>assistant") == 1:
        return call("calc_add", a=int(asked.group(1)), b=int(asked.group(2)))
    (result,) = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
    return "The sum is 44." if asked.groups() == ("4", "4") else f"The sum is {result}."


@pytest.fixture(scope="module")
async def engine(codec):
    async with scripted_engine(TextScript(codec, _reply)) as address:
        yield address


def _config(tmp_path: Path, environment: dict[str, Any], engine: str, **overrides: Any) -> RolloutConfig:
    return RolloutConfig.model_validate({
        "engines": {"addresses": [engine]}, "tools": {"launch": None}, "dataset": {"verifiers": environment},
        "output_dir": str(tmp_path / "out"), "report": False, "trace": False, "router": {"no_server_wait_s": 5},
        **overrides})


async def _run(config: RolloutConfig) -> RunRecord:
    record = RunRecord(output_dir=Path(config.output_dir))
    return await run_rollout(config, Progress(Console(file=io.StringIO())), record)


def _model_tokens(trajectory) -> list[int]:
    return [i for i, m in zip(trajectory.response_ids, trajectory.response_mask, strict=True) if m]


async def test_a_single_turn_environment_gives_its_tasks_rewards_and_the_engine_tokens(tmp_path, engine, codec):
    environment = {"env": "agentloop_vf_single", "args": {"taskset": {"questions": 2}, **NULL_HARNESS}}
    config = _config(tmp_path, environment, engine, samples_per_prompt=2,
                     agent={"max_concurrency": 4, "gateway": {"sampling": {"temperature": 0.0}}})
    ts = (await _run(config)).trajectories
    assert [t.sample_id for t in ts] == ["task-0/0", "task-0/1", "task-1/0", "task-1/1"]  # the taskset's, in order
    assert [t.group_id for t in ts] == ["task-0", "task-0", "task-1", "task-1"]
    assert not any(t.failed for t in ts), [t.error for t in ts]
    assert [t.reward for t in ts] == [1.0, 1.0, 0.0, 0.0]  # the task's own reward: 5 is wrong for 4 + 4
    for t, question in zip(ts, ["What is 2 + 3?", "What is 2 + 3?", "What is 4 + 4?", "What is 4 + 4?"]):
        assert t.loop == "gateway" and t.drift is None and t.assistant_turns == 1
        assert list(t.prompt_ids) == codec.prompt_ids([{"role": "user", "content": question}], [])
        assert _model_tokens(t) == [*codec.encode("The answer is 5."), EOS]
    summary = json.loads((Path(config.output_dir) / "summary.json").read_text())
    assert summary["trajectories"] == 4 and summary["failures"] == 0


async def test_a_tool_environment_serves_its_tool_over_mcp_and_tells_its_failures_from_bad_answers(
        tmp_path, engine, codec):
    config = _config(tmp_path, {"env": "agentloop_vf_tools", "args": NULL_HARNESS}, engine,
                     agent={"max_concurrency": 4, "timeout_s": 120})
    plain, wrong, crash, judge = (await _run(config)).trajectories
    for t in (plain, wrong):
        assert not t.failed and t.drift is None, t.error
        assert t.assistant_turns == 2 and t.tool_calls == 1
        # the tool's result is context (mask 0), served by the environment's own MCP server
        context = codec.decode([i for i, m in zip(t.response_ids, t.response_mask, strict=True) if not m])
        assert "<tool_response>" in context
    # the model's tokens are the engine's: the call, then the answer
    assert _model_tokens(plain) == [*codec.encode(call("calc_add", a=2, b=3)), EOS,
                                    *codec.encode("The sum is 5."), EOS]
    assert plain.reward == 1.0
    assert wrong.reward == 0.0 and _model_tokens(wrong)[-len(codec.encode("The sum is 44.")) - 1:] == [
        *codec.encode("The sum is 44."), EOS]  # a wrong answer: a low reward, not a failure
    # the tool server died mid-call: verifiers' harness program gave up; the chain is kept and never trained on
    assert crash.failed and crash.infrastructure_failure and crash.assistant_turns == 1
    assert crash.infrastructure_cause == "environment_harness"
    assert crash.error.startswith("the episode failed with verifiers HarnessError: harness 'null' exited"), crash.error
    # the reward raised: the task's scoring, not the model, failed
    assert judge.failed and judge.infrastructure_failure and judge.assistant_turns == 2
    assert judge.infrastructure_cause == "environment_task"
    assert "verifiers TaskError" in judge.error and "the judge is unreachable" in judge.error, judge.error
    summary = json.loads((Path(config.output_dir) / "summary.json").read_text())
    assert summary["infrastructure_causes"] == {"environment_harness": 1, "environment_task": 1}


@pytest.mark.parametrize(("environment", "agent", "expected"), [
    ({"env": "agentloop_vf_duel"}, None, "an environment of 2 seats (first, second) is refused"),
    ({"env": "agentloop_vf_single", "args": {"agent": {"model": "gpt-x"}}}, None,
     "args.agent.model: the seat's model calls go to this run's gateway"),
    ({"env": "agentloop_vf_single", "args": {"agent": {"retries": {"max_retries": 2}}}}, None,
     "args.agent.retries: a retried attempt would stay in its session"),
    ({"env": "agentloop_vf_nowhere"}, None, "the verifiers environment 'agentloop_vf_nowhere' cannot be loaded"),
    ({"env": "agentloop_vf_single", "harness_wheels": "/nonexistent"}, None,
     "harness_wheels: /nonexistent is not a directory"),
])
async def test_what_cannot_give_this_runs_trajectories_is_refused_before_any_server(
        tmp_path, environment, agent, expected):
    config = _config(tmp_path, environment, "127.0.0.1:1", **({"agent": agent} if agent else {}))
    with pytest.raises((DatasetError, LoopConfigError), match=re.escape(expected)):
        await _run(config)


@pytest.mark.parametrize(("document", "expected"), [
    ({"agent": {"callable": "x:y"}}, "a verifiers dataset is played by its environment"),
    ({"agent": {"reward": "function"}, "reward": {"path": "x:y"}}, "a verifiers environment's rewards score its rows"),
    ({"environment": {"args": {"retries": {"max_retries": 1}}}}, "retries are refused"),
    ({"environment": {"args": {"taskset": {"id": "other"}}}}, "args.taskset.id: the taskset is `env`"),
])
def test_contradictions_are_config_errors(tmp_path, document, expected):
    environment = {"env": "agentloop_vf_single", **document.pop("environment", {})}
    with pytest.raises(ValidationError, match=re.escape(expected)):
        _config(tmp_path, environment, "127.0.0.1:1", **document)


def test_agentloop_train_takes_the_same_sections():
    from agentloop_grpc.train.config import TrainConfig

    environment = {"env": "agentloop_vf_single", "args": NULL_HARNESS}
    config = TrainConfig.model_validate({"engines": {"addresses": ["127.0.0.1:1"]}, "tools": {"launch": None},
                                         "dataset": {"verifiers": environment}, "agent": {"max_concurrency": 2}})
    assert config.agent.verifiers == config.dataset.verifiers and config.agent.max_concurrency == 2


def _example() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "verifiers_rollout.yaml").read_text())


def test_the_page_shows_the_example_config():
    page = (ROOT / "docs" / "environments.md").read_text()
    section = page[page.index("## verifiers"):]
    shown = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)]
    example = _example()
    assert {"dataset": example["dataset"], "agent": example["agent"]} in shown


@pytest.mark.slow
async def test_smollm2_plays_the_example_environment_as_configured(tmp_path, embedded_server, codec):  # noqa: F811
    # the example as written, on this module's engine server instead of a launched one, its first question only
    document = {**_example(), "engines": {"addresses": [embedded_server]}, "output_dir": str(tmp_path / "out"),
                "report": False}
    document["dataset"]["limit"] = 1
    (t,) = (await _run(RolloutConfig.model_validate(document))).trajectories
    assert not t.failed and t.drift is None and 1 <= t.assistant_turns <= 3, t.error
    assert list(t.prompt_ids)[-8:] == codec.prompt_ids([{"role": "user", "content": "What is 17 * 23?"}], [])[-8:]
    model = [lp for lp, m in zip(t.response_logprobs, t.response_mask, strict=True) if m]
    assert model and all(lp <= 0 for lp in model) and len(model) <= 64 * t.assistant_turns
    # the environment scored what the engine wrote: its reward is the task's check of the model's last turn
    last = t.response_ids[max(i for i, m in enumerate(t.response_mask) if not m) + 1:] if 0 in t.response_mask \
        else t.response_ids
    assert t.reward == float("391" in codec.decode(list(last)))
