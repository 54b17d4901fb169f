"""A loop configuration no worker could run ends `agentloop rollout` and `agentloop train` in one `error:` line
before any server starts (the CLI in its own process, as a user runs it): an unknown default loop, a row naming an
unknown loop, a loop module that does not import, a loop class whose constructor refuses its kwargs or raises, and
a class with no async run. Each once made the servers start (minutes with embedded engines) and then ended in a
traceback, or in every trajectory failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ..agent.custom_loops import PATH as REVISE
from ..train.broken_loops import PATH as BROKEN

ROOT = Path(__file__).resolve().parents[2]
AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    {"id": "b", "messages": [{"role": "user", "content": "What is 4 + 4?"}], "loop": "single_turn"},
]
#: What each command adds to the sections they share (a training run small enough to start at once).
COMMAND_FIELDS: dict[str, dict[str, object]] = {
    "rollout": {"report": False},
    "train": {"grpo": {"max_steps": 1, "prompts_per_step": 1, "num_generations": 2, "trainable_layers": 1},
              "check_logprobs": 0, "save_model": False},
}


def _run(tmp_path: Path, command: str, rows: list[dict], default_loop: str, loops: dict,
         extra: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    config = {
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "fake", "vocab_size": 49152}}},
        "tools": {"launch": None},
        "dataset": {"path": str(data), "default_loop": default_loop},
        "loops": loops,
        "report_to": [],
        "output_dir": str(out),
        **COMMAND_FIELDS[command],
        **(extra or {}),
    }
    path = tmp_path / f"{command}.yaml"
    path.write_text(yaml.safe_dump(config))
    # the loops' modules are the user's, found on PYTHONPATH as a user's own package would be; a `trl` that
    # cannot be imported comes first: the checks answer before the trainer's imports (seconds) are paid
    poisoned = tmp_path / "poisoned"
    (poisoned / "trl").mkdir(parents=True)
    (poisoned / "trl" / "__init__.py").write_text("raise RuntimeError('trl imported before the config was checked')")
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(poisoned), str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([*AGENTLOOP, command, "--config", str(path)], capture_output=True, text=True,
                            timeout=300, env=env, cwd=ROOT)
    return result, out


CASES = {
    "unknown-default-loop": (
        ROWS, "nope", {}, "dataset.default_loop: no loop named 'nope'; known: ['single_turn', 'tool']"),
    "row-names-an-unknown-loop": (
        [*ROWS, {"id": "c", "messages": [{"role": "user", "content": "Hi"}], "loop": "revize"}], "tool", {},
        "sample c/0 names the loop 'revize', which is neither built in nor under loops; known: "
        "['single_turn', 'tool']"),
    "loop-module-missing": (
        ROWS, "tool", {"mine": {"path": "tests.no_such_module:Loop"}},
        "loops.mine: tests.no_such_module:Loop cannot be imported (ModuleNotFoundError"),
    "constructor-refuses-kwargs": (
        ROWS, "revise", {"revise": {"path": REVISE, "kwargs": {"follow_up": "Again.", "colour": "red"}}},
        f"loops.revise: {REVISE} could not be built (TypeError: "),
    "constructor-raises": (
        ROWS, "tool", {"mine": {"path": f"{BROKEN}:RefuseToBuild"}},
        f"loops.mine: {BROKEN}:RefuseToBuild could not be built (RuntimeError: no GPU for this loop)"),
    "no-async-run": (
        ROWS, "tool", {"mine": {"path": "tests.agent.custom_loops:NoRun"}},
        "loops.mine: tests.agent.custom_loops:NoRun gave a NoRun, which has no async run(sample) method"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["rollout", pytest.param("train", marks=pytest.mark.slow)])
def test_a_loop_no_worker_could_run_ends_in_one_line_before_any_server_starts(tmp_path, command, case):
    rows, default_loop, loops, expected = CASES[case]
    result, out = _run(tmp_path, command, rows, default_loop, loops)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert expected in line
    assert "starting engine and tool servers" not in result.stdout + result.stderr
    assert not (out / "logs").exists()  # where launched servers log: nothing was launched


@pytest.mark.parametrize("command", ["rollout", pytest.param("train", marks=pytest.mark.slow)])
def test_an_agent_that_cannot_run_ends_in_one_line_before_any_server_starts(tmp_path, command):
    result, out = _run(tmp_path, command, ROWS, "tool", {}, {"agent": {"callable": "tests.no_such_module:play"}})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "agent.callable: tests.no_such_module:play" in line
    assert "starting engine and tool servers" not in result.stdout + result.stderr
    assert not (out / "logs").exists()
