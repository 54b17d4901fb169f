"""`agentloop rollout` with each coding harness, unmodified, on the scripted engine: Codex CLI, Claude Code and
mini-swe-agent at the versions `make setup` pins, and a command of our own. Two generated tasks each: the scripted
model fixes the first (reward 1.0) and writes a wrong fix to the second (0.0, all-pass); every trajectory is
token-exact (the model's tokens are the engine's, each turn with its end of turn) and carries the CLI's exit code,
output and final diff. A CLI that crashes or runs past its time is a failure by cause; one that exits non-zero after
the model's turns is scored by the tests."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.common.jail import probe_cached
from agentloop_grpc.harness.clis import HarnessError, find_program
from agentloop_grpc.harness.generated_tasks import BUGS
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.run import RunRecord, run_rollout

from ..agent.conftest import EOS, TextScript, call, scripted_engine

pytestmark = pytest.mark.skipif(probe_cached() is not None, reason=f"no sandbox here: {probe_cached()}")

HERE = Path(__file__).resolve().parent
FINISH = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's own way to end
DONE = "Fixed."
WRONG = "def mean(xs):\n    return 0\n"


def _write(module: str, source: str) -> str:
    data = base64.b64encode(source.encode()).decode()
    return (f"python3 -c \"import base64, pathlib; pathlib.Path('{module}').write_bytes(base64.b64decode("
            f"'{data}'))\"")


def fix_of(prompt: str) -> str:
    """The shell command the scripted model runs: the known-good fix of clamp, a wrong one of anything else."""
    package, name = re.search(r"The code is in `([a-z]+)/([a-z]+)\.py`", prompt).groups()
    source = next(b.fixed for b in BUGS if b.name == name) if name == "clamp" else WRONG
    return _write(f"{package}/{name}.py", source)


def reply(prompt: str) -> str:
    """Each CLI's shell tool, by the tool its prompt offers: the fix, then the end (mini-swe-agent's command)."""
    first = prompt.count("<|im_start|>assistant") == 1
    if "exec_command" in prompt:
        return call("exec_command", cmd=fix_of(prompt)) if first else DONE
    if '"Bash"' in prompt:
        return call("Bash", command=fix_of(prompt), description="fix") if first else DONE
    if FINISH in prompt:
        return call("bash", command=fix_of(prompt) if first else f"echo {FINISH}")
    return call("bash", command=fix_of(prompt)) if first else DONE


@pytest.fixture(scope="module")
def codec():
    return load_codec(None)


@pytest.fixture(scope="module")
async def engine(codec):
    script = TextScript(codec, reply)
    async with scripted_engine(script, max_model_len=65536) as address:
        yield address, script


async def _rollout(tmp_path: Path, engine: str, agent: dict[str, Any]) -> list:
    out = tmp_path / "out"
    config = RolloutConfig.model_validate({
        "engines": {"addresses": [engine]}, "tools": {"launch": None},
        "dataset": {"coding_tasks": {"generated": 2}},
        "agent": {"tests_reward": "all_pass", "timeout_s": 240,
                  "workspace": {"root": str(tmp_path / "workspaces"), "read_only": [str(HERE)]}, **agent},
        "output_dir": str(out), "report": False, "trace": False, "router": {"no_server_wait_s": 5}})
    record = RunRecord(output_dir=out)
    await run_rollout(config, Progress(Console(file=io.StringIO())), record)
    assert not (tmp_path / "workspaces").exists() or not list((tmp_path / "workspaces").iterdir())
    return record.trajectories


HARNESSES = {
    "codex": {"harness": "codex"},
    "claude-code": {"harness": "claude-code"},
    "mini-swe-agent": {"harness": "mini-swe-agent"},
    "command": {"harness": "command", "command": ["python3", str(HERE / "bash_agent.py")]},
}


@pytest.mark.parametrize("name", list(HARNESSES))
async def test_each_harness_completes_a_task_token_exact_and_is_rewarded_by_the_tests(tmp_path, engine, codec, name):
    if name != "command":
        try:
            find_program(name)
        except HarnessError as error:
            pytest.fail(f"{error}: make setup installs it")
    address, _ = engine
    good, wrong = await _rollout(tmp_path, address, HARNESSES[name])
    assert [t.sample_id.split("-", 2)[-1] for t in (good, wrong)] == ["clamp/0", "mean/0"]
    assert not good.failed and not wrong.failed, [good.error, wrong.error]
    assert (good.reward, wrong.reward) == (1.0, 0.0)
    for t in (good, wrong):
        prompt = codec.decode(t.prompt_ids)
        turns = [reply(prompt)]
        turns.append(reply(prompt + "<|im_start|>assistant\n"))  # the second turn's reply, by the same rule
        model = [i for i, m in zip(t.response_ids, t.response_mask, strict=True) if m]
        assert model == [i for text in turns for i in (*codec.encode(text), EOS)]  # the engine's ids, exactly
        assert t.drift is None or t.drift.kind == "tokenization"
        assert t.metadata["harness"] == name and t.metadata["exit_code"] == "0"
    assert "+    return max(lo, min(hi, x))" in good.metadata["diff"]
    assert (good.metadata["tests_passed"], wrong.metadata["tests_failed"]) == ("3", "3")


async def test_a_cli_that_crashes_or_hangs_is_a_failure_by_cause_and_a_non_zero_exit_is_scored(tmp_path, engine):
    address, _ = engine
    crashed = await _rollout(tmp_path / "a", address, {"harness": "command", "command": ["sh", "-c", "kill -9 $$"]})
    assert [(t.failed, t.infrastructure_cause) for t in crashed] == [(True, "harness_crashed")] * 2
    hung = await _rollout(tmp_path / "b", address, {"harness": "command", "command": ["sleep", "60"],
                                                    "workspace": {"wall_timeout_s": 1}})
    assert [(t.failed, t.infrastructure_cause) for t in hung] == [(True, "harness_timeout")] * 2
    # the model's turns, then an exit code of 3 (as Codex exits on a reply cut at its limit): scored by the tests
    agent = ["sh", "-c", f"python3 {HERE / 'bash_agent.py'} && exit 3"]
    exited = await _rollout(tmp_path / "c", address, {"harness": "command", "command": agent})
    assert [(t.failed, t.reward, t.metadata["exit_code"]) for t in exited] == [(False, 1.0, "3"), (False, 0.0, "3")]
    silent = await _rollout(tmp_path / "d", address, {"harness": "command", "command": ["sh", "-c", "exit 3"]})
    assert [(t.failed, t.infrastructure_cause) for t in silent] == [(True, "agent_no_turn")] * 2


def test_each_cli_is_started_unattended_with_its_model_at_the_session() -> None:
    from agentloop_grpc.harness.clis import MINI_SWE_AGENT_STEP_LIMIT, launch

    codex = launch("codex", "Fix it.", "s1", "key", "agentloop")
    assert "--dangerously-bypass-approvals-and-sandbox" in codex.argv and codex.argv[-1] == "Fix it."
    assert 'base_url = "http://127.0.0.1:8000/sessions/s1/v1"' in codex.files[".codex/config.toml"]
    claude = launch("claude-code", "Fix it.", "s1", "key", "agentloop")
    assert claude.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000/sessions/s1" and "-p" in claude.argv
    # mini-swe-agent has no step limit of its own: an agent whose model never submits would run to the wall time
    mini = launch("mini-swe-agent", "Fix it.", "s1", "key", "agentloop")
    assert f"agent.step_limit={MINI_SWE_AGENT_STEP_LIMIT}" in mini.argv and "--yolo" in mini.argv
