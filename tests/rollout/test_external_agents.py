"""`agentloop rollout` with an agent of the user's own (``agent:``) instead of our loops: every sample a session of
the session gateway the run serves, played by an unmodified agent (the real ``openai`` SDK) as a Python function
or as a command, against one scripted fake engine server shared by the module's tests (in this process).

Each sample's trajectories are token-exact (the engine's tokens, no drift), ``samples_per_prompt`` sessions share
their group, rewards come from the session's reward route or the rollout's reward function, an agent that hangs
past timeout_s or crashes is an infrastructure failure beside the others' trajectories, and a config whose agent
cannot run ends in one sentence before any server starts. An agent's key opens its own session's model and reward
routes alone.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import psutil
import pytest
import yaml
from pydantic import ValidationError
from rich.console import Console

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.gateway.agents import SessionKeys
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.run import LoopConfigError, RunRecord, run_rollout
from agentloop_grpc.router import Router, RouterConfig

from ..agent.conftest import EOS, TextScript, call, scripted_engine
from . import external_agent
from .external_agent import PATH, TOOLS

ROOT = Path(__file__).resolve().parents[2]
AGENT_SCRIPT = Path(external_agent.__file__)
ANSWER = "The answer is 5."
QUESTION = {"role": "user", "content": "What is 2 + 3?"}
ROWS = [
    {"id": "a", "messages": [QUESTION], "ground_truth": "5"},
    {"id": "b", "messages": [{"role": "user", "content": "What is 4 + 4?"}], "ground_truth": "8"},
]
GREEDY = {"sampling": {"temperature": 0.0}}


def _reply(text: str) -> str:
    """The scripted model: a calculator call first when tools are offered, then the answer."""
    first = text.count("<|im_start|>assistant") == 1
    return call("calculator", expression="2+3") if first and "calculator" in text else ANSWER


@pytest.fixture(scope="module")
def codec():
    return load_codec(None)


@pytest.fixture(scope="module")
async def engine(codec):
    async with scripted_engine(TextScript(codec, _reply)) as address:
        yield address


def _config(tmp_path: Path, agent: dict[str, Any], rows: list[dict] = ROWS, **overrides: Any) -> RolloutConfig:
    return RolloutConfig.model_validate(_document(tmp_path, agent, rows, **overrides))


def _document(tmp_path: Path, agent: dict[str, Any], rows: list[dict] = ROWS, **overrides: Any) -> dict[str, Any]:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "tools": {"launch": None},
        "dataset": {"path": str(data)},
        "agent": agent,
        "output_dir": str(tmp_path / "out"),
        "report": False,
        "trace": False,
        "router": {"no_server_wait_s": 5},
        **overrides,
    }
    return config


async def _run(config: RolloutConfig) -> RunRecord:
    record = RunRecord(output_dir=Path(config.output_dir))
    return await run_rollout(config, Progress(Console(file=io.StringIO())), record)


def _summary(config: RolloutConfig) -> dict:
    return json.loads((Path(config.output_dir) / "summary.json").read_text())


async def test_a_callable_agent_through_the_openai_sdk_gives_token_exact_trajectories(tmp_path, engine, codec):
    config = _config(tmp_path, {"callable": f"{PATH}:tool_agent", "gateway": GREEDY},
                     engines={"addresses": [engine]}, samples_per_prompt=2)
    record = await _run(config)
    ts = record.trajectories
    assert [t.sample_id for t in ts] == ["a/0", "a/1", "b/0", "b/1"]  # the samples' order
    assert [t.group_id for t in ts] == ["a", "a", "b", "b"]  # samples_per_prompt sessions: one GRPO group
    assert not any(t.failed for t in ts), [t.error for t in ts]
    assert [t.reward for t in ts] == [1.0, 1.0, 0.25, 0.25]  # what each agent posted to its reward route
    for t, row in zip(ts, [ROWS[0], ROWS[0], ROWS[1], ROWS[1]], strict=True):
        assert t.loop == "gateway" and t.drift is None
        assert t.assistant_turns == 2 and t.tool_calls == 1
        assert list(t.prompt_ids) == codec.prompt_ids(row["messages"], TOOLS)
        # the model's tokens are the engine's, exactly: the call, then the answer, each with its end of turn
        model = [i for i, m in zip(t.response_ids, t.response_mask, strict=True) if m]
        assert model == [*codec.encode(call("calculator", expression="2+3")), EOS, *codec.encode(ANSWER), EOS]
        assert "5" in codec.decode([i for i, m in zip(t.response_ids, t.response_mask, strict=True) if not m])
    summary = _summary(config)
    assert summary["trajectories"] == 4 and summary["failures"] == 0 and summary["drifted_trajectories"] == 0
    assert summary["routing_decisions"]["new"] >= 4
    out = Path(config.output_dir)
    assert (out / "batch.pt").exists()
    assert [t.sample_id for t in read_parquet(out / "trajectories.parquet")] == ["a/0", "a/1", "b/0", "b/1"]


@pytest.mark.parametrize(("selection", "kept"), [("all", [0, 1, 2]), ("longest", [0]), ("last", [2])])
async def test_trajectory_selection_keeps_the_chains_it_names_with_the_agents_metadata(tmp_path, engine, selection,
                                                                                        kept):
    config = _config(tmp_path, {"callable": f"{PATH}:forking_agent", "trajectory_selection": selection},
                     engines={"addresses": [engine]}, rows=ROWS[:1])
    ts = (await _run(config)).trajectories
    assert [t.sample_id for t in ts] == [["a/0", "a/0/fork-1", "a/0/fork-2"][i] for i in kept]
    assert all(t.metadata == {"chains_started": "3"} and not t.failed for t in ts)


async def test_reward_function_scores_with_the_ground_truth_and_drops_posted_rewards(tmp_path, engine):
    config = _config(tmp_path, {"callable": f"{PATH}:tool_agent", "reward": "function"},
                     engines={"addresses": [engine]}, reward={"path": f"{PATH}:exact_answer"})
    record = await _run(config)
    assert [(t.sample_id, t.reward) for t in record.trajectories] == [("a/0", 1.0), ("b/0", 0.0)]


async def test_a_reward_function_that_raises_fails_its_sample_alone(tmp_path, engine):
    config = _config(tmp_path, {"callable": f"{PATH}:tool_agent", "reward": "function"},
                     engines={"addresses": [engine]}, reward={"path": f"{PATH}:judge_of_fives"})
    a, b = (await _run(config)).trajectories
    assert not a.failed and a.reward == 1.0
    # the chain is kept, token by token, and flagged: the reward function's fault, never trained on
    assert b.infrastructure_failure and b.error == "the reward function raised RuntimeError: no judge for 8"
    assert b.assistant_turns == 2 and 1 in b.response_mask


async def test_hung_raising_and_stalled_agents_are_infrastructure_failures_beside_the_others(tmp_path, engine):
    rows = [ROWS[0], {**ROWS[0], "id": "hang", "behaviour": "hang"}, {**ROWS[0], "id": "raise", "behaviour": "raise"},
            {**ROWS[0], "id": "silent", "behaviour": "silent"}, {**ROWS[0], "id": "stall", "behaviour": "stall"}]
    config = _config(tmp_path, {"callable": f"{PATH}:tool_agent", "timeout_s": 1.5, "max_concurrency": 3}, rows,
                     engines={"addresses": [engine]})
    record = await _run(config)
    by_id = {t.sample_id: t for t in record.trajectories}
    assert list(by_id) == ["a/0", "hang/0", "raise/0", "silent/0", "stall/0"]
    assert not by_id["a/0"].failed and by_id["a/0"].reward == 1.0
    for name in ("hang/0", "raise/0", "silent/0"):
        assert by_id[name].failed and by_id[name].infrastructure_failure and by_id[name].response_ids == ()
    assert by_id["hang/0"].error == "the agent ran past timeout_s=1.5 and was stopped before asking the model anything"
    assert by_id["raise/0"].error == ("the agent raised ValueError: the agent of 2-raise_0 gave up before asking the "
                                      "model anything")
    assert by_id["silent/0"].error == "the agent ended without asking the model anything"
    # a chain the agent left behind: kept for the record, failed by the infrastructure, never trained on
    stalled = by_id["stall/0"]
    assert stalled.infrastructure_failure and stalled.assistant_turns == 1 and stalled.reward == 0.0
    assert stalled.error == "the agent ran past timeout_s=1.5 and was stopped"
    summary = _summary(config)
    assert summary["trajectories"] == 5 and summary["failures"] == 4 and summary["infrastructure_failures"] == 4


async def test_a_sync_agent_runs_in_a_thread_and_its_timeout_fails_its_chain(tmp_path, engine):
    rows = [ROWS[0], {**ROWS[1], "behaviour": "hang"}, {**ROWS[1], "id": "c", "behaviour": "raise"}]
    config = _config(tmp_path, {"callable": f"{PATH}:sync_agent", "timeout_s": 1.5}, rows,
                     engines={"addresses": [engine]})
    record = await _run(config)
    a, hang, crash = record.trajectories
    assert not a.failed and a.assistant_turns == 1 and a.reward == 0.0  # no reward posted: 0.0
    assert hang.failed and hang.infrastructure_failure and "timeout_s=1.5" in hang.error
    assert crash.failed and crash.infrastructure_failure and "ValueError" in crash.error
    assert _summary(config)["infrastructure_failures"] == 2


async def test_a_command_agent_finds_its_session_in_its_environment(tmp_path, engine):
    rows = [ROWS[0], {**ROWS[1], "behaviour": "exit"}, {**ROWS[1], "id": "c", "behaviour": "hang"}]
    config = _config(tmp_path, {"command": [sys.executable, str(AGENT_SCRIPT)], "timeout_s": 6}, rows,
                     engines={"addresses": [engine]})
    record = await _run(config)
    ok, exited, hung = record.trajectories
    assert not ok.failed and ok.reward == 1.0 and ok.assistant_turns == 1 and ok.drift is None, ok.error
    logs = Path(config.output_dir) / "logs" / "agents"
    assert exited.infrastructure_failure and exited.error == (
        f"the agent exited with code 1 (its log: {logs / '1-b_0.log'}) before asking the model anything")
    assert (logs / "1-b_0.log").read_text().startswith("session 1-b_0: exit")
    assert hung.infrastructure_failure and "timeout_s=6" in hung.error
    child = int(re.search(r"child (\d+)", (logs / "2-c_0.log").read_text()).group(1))
    await asyncio.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE  # its group
    assert _summary(config)["infrastructure_failures"] == 2


@pytest.mark.parametrize(("agent", "expected"), [
    ({"callable": "tests.no_such_module:agent"},
     "agent.callable: tests.no_such_module:agent cannot be imported (ModuleNotFoundError: No module named "
     "'tests.no_such_module')"),
    ({"callable": f"{PATH}:no_such_agent"}, f"agent.callable: {PATH}:no_such_agent cannot be imported "
     "(AttributeError: "),
    ({"callable": f"{PATH}:TOOLS"}, f"agent.callable: {PATH}:TOOLS is a list, not a function"),
    ({"command": ["no-such-agent-program", "--x"]},
     "agent.command: no-such-agent-program is not an executable program (not found on PATH)"),
], ids=["module", "attribute", "not-callable", "command"])
async def test_an_agent_that_cannot_run_is_one_sentence_before_any_server_starts(tmp_path, agent, expected):
    config = _config(tmp_path, agent, engines={"launch": {"replicas": 1, "engine": {"kind": "fake"}}})
    with pytest.raises(LoopConfigError) as raised:
        await _run(config)
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)
    assert not (tmp_path / "out" / "logs").exists()  # nothing was launched


def test_the_cli_says_it_in_one_error_line(tmp_path):
    config = _document(tmp_path, {"command": ["./no-such-agent"]},
                       engines={"launch": {"replicas": 1, "engine": {"kind": "fake"}}})
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "rollout", "--config", str(path)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "error: agent.command: ./no-such-agent is not an executable program (not found)"


async def test_a_session_key_opens_its_own_model_and_reward_routes_alone(engine, codec):
    async with Router([engine], RouterConfig(no_server_wait_s=5)) as router:
        await router.fleet.wait_ready()
        gateway = SessionGateway(router, codec)
        keys = SessionKeys("the-run-token")
        app = create_app(gateway, user_token="the-run-token")
        keys.install(app)
        async with serve_app(app) as url, httpx.AsyncClient(base_url=url) as http:
            key = keys.grant("s1")
            auth = {"Authorization": f"Bearer {key}"}
            turn = {"model": "m", "messages": [QUESTION]}
            assert (await http.post("/sessions/s1/v1/chat/completions", json=turn, headers=auth)).status_code == 200
            assert (await http.post("/sessions/s1/reward", json={"reward": 1}, headers={"x-api-key": key})
                    ).status_code == 200
            for method, path in [("POST", "/sessions/s2/v1/chat/completions"), ("POST", "/sessions/s1/finish"),
                                 ("GET", "/sessions"), ("GET", "/sessions/s1"), ("POST", "/sessions")]:
                answer = await http.request(method, path, json=turn, headers=auth)
                assert answer.status_code == 401, (method, path)
            # the Anthropic SDK, as a command agent's ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY set it up (x-api-key)
            async with anthropic.AsyncAnthropic(base_url=f"{url}/sessions/s1", api_key=key,
                                                max_retries=0) as anthropic_client:
                reply = await anthropic_client.messages.create(model="m", max_tokens=16, messages=[
                    {"role": "user", "content": QUESTION["content"]}])
            assert reply.content[0].text == ANSWER
            keys.revoke("s1")
            assert (await http.post("/sessions/s1/v1/chat/completions", json=turn, headers=auth)).status_code == 401
            assert (await http.get("/sessions", headers={"Authorization": "Bearer the-run-token"})).status_code == 200


@pytest.mark.parametrize(("agent", "expected"), [
    ({}, "agent: give exactly one of callable or command"),
    ({"callable": f"{PATH}:tool_agent", "command": ["x"]}, "agent: give exactly one of callable or command"),
    ({"callable": "tool_agent"}, "agent.callable: 'tool_agent' is not of the form module:function"),
    ({"command": []}, "agent.command"),
    ({"callable": f"{PATH}:tool_agent", "reward": "function"},
     "agent.reward: function scores with the rollout's reward function; set reward"),
    ({"command": ["x"], "timeout_s": 7200}, "agent.timeout_s (7200) is longer than agent.gateway.limits.session_ttl_s "
     "(3600)"),
], ids=["neither", "both", "not-a-path", "empty-command", "function-without-reward", "timeout-past-ttl"])
def test_the_config_refuses_an_agent_section_that_cannot_work(tmp_path, agent, expected):
    with pytest.raises(ValidationError) as raised:
        _config(tmp_path, agent, engines={"addresses": ["127.0.0.1:1"]})
    assert expected in str(raised.value)


async def test_an_interrupted_run_kills_its_command_agents_and_keeps_what_finished(tmp_path, engine):
    rows = [ROWS[0], {**ROWS[1], "id": "c", "behaviour": "hang"}]
    config = _config(tmp_path, {"command": [sys.executable, str(AGENT_SCRIPT)], "timeout_s": 300}, rows,
                     engines={"addresses": [engine]})
    record = RunRecord(output_dir=Path(config.output_dir))
    run = asyncio.create_task(run_rollout(config, Progress(Console(file=io.StringIO())), record))
    log = Path(config.output_dir) / "logs" / "agents" / "1-c_0.log"
    async with asyncio.timeout(60):
        while not (record.trajectories and log.exists() and "child" in log.read_text()):
            await asyncio.sleep(0.05)
    child = int(re.search(r"child (\d+)", log.read_text()).group(1))
    run.cancel()  # Ctrl-C
    with pytest.raises(asyncio.CancelledError):
        await run
    assert record.interrupted and [t.sample_id for t in record.trajectories] == ["a/0"]
    assert json.loads((Path(config.output_dir) / "summary.json").read_text())["interrupted"] is True
    await asyncio.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
