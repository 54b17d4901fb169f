"""`agentloop rollout --config` with a loop of a user's own named in the YAML (``loops:``, a module outside the
package): rows that name it run it with its own config, beside built-in loops (the CLI in its own process, a
scripted fake engine server in this one). A row naming a loop that does not
exist ends the command in one sentence before any server starts; a custom loop under a built-in name, an unknown
default loop and an import path that imports nothing are refused as early (checked in process: the CLI's way of
printing a config error in one sentence is tested in test_rollout_cli.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.rollout.config import load_config
from agentloop_grpc.rollout.dataset import read_rows, to_samples
from agentloop_grpc.rollout.run import RolloutError, check_loops

from ..agent.conftest import TextScript, scripted_engine
from ..agent.custom_loops import PATH

ROOT = Path(__file__).resolve().parents[2]
AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
FOLLOW_UP = "Check it once more."
REVISE = {"path": PATH, "kwargs": {"follow_up": FOLLOW_UP, "rounds": 1}}


def _config(tmp_path: Path, rows: list[dict], **overrides) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "engines": {"launch": {"replicas": 1,
                               "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.001}}},
        "tools": {"launch": None},
        "dataset": {"path": str(data), "default_loop": "single_turn"},
        "loops": {"revise": REVISE},
        "loop": {"max_new_tokens_per_turn": 12},
        "output_dir": str(tmp_path / "out"),
        "report": False,
    }
    config.update(overrides)
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _env() -> dict[str, str]:
    # the loop's module is the user's, found on PYTHONPATH as a user's own package would be
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _run(config: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTLOOP, "rollout", "--config", str(config)], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=ROOT)


ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "loop": "revise"},
    {"id": "b", "messages": [{"role": "user", "content": "What is 4 + 4?"}], "loop": "revise"},
    {"id": "c", "messages": [{"role": "user", "content": "What is 1 + 1?"}]},
]


@pytest.mark.slow
async def test_rows_run_the_custom_loop_named_in_the_yaml_with_its_own_config(tmp_path):
    codec = load_codec(None)
    script = TextScript(codec, ["It is 5.", "Yes, 5."])
    async with scripted_engine(script) as engine:
        config = _config(tmp_path, ROWS, engines={"addresses": [engine]})
        # the CLI runs in its own process while this event loop serves its engine
        process = await asyncio.create_subprocess_exec(
            *AGENTLOOP, "rollout", "--config", str(config), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_env(), cwd=ROOT)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    by_id = {t.sample_id: t for t in read_parquet(tmp_path / "out" / "trajectories.parquet")}
    assert {i: t.loop for i, t in by_id.items()} == {"a/0": "revise", "b/0": "revise", "c/0": "single_turn"}
    assert not any(t.failed for t in by_id.values())
    for revised in (by_id["a/0"], by_id["b/0"]):  # rounds=1 and the follow-up, from the YAML's kwargs
        assert [m["content"] for m in revised.messages[1:]] == ["It is 5.", FOLLOW_UP, "Yes, 5."]
    assert [m["content"] for m in by_id["c/0"].messages[1:]] == ["It is 5."]


def test_a_row_naming_no_loop_ends_in_one_sentence_before_servers_start(tmp_path):
    rows = [*ROWS, {"id": "d", "messages": [{"role": "user", "content": "Hi"}], "loop": "revize"}]
    result = _run(_config(tmp_path, rows), timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert ("error: sample d/0 names the loop 'revize', which is neither built in nor under loops; known: "
            "['revise', 'single_turn', 'tool']") in result.stderr
    assert not (tmp_path / "out" / "logs").exists()  # nothing was launched


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"loops": {"tool": REVISE}}, "['tool'] are built-in loop names"),
        ({"dataset": {"path": "rows.jsonl", "default_loop": "nope"}},
         "dataset.default_loop: no loop named 'nope'; known: ['revise', 'single_turn', 'tool']"),
    ],
    ids=["built-in-name", "unknown-default-loop"],
)
def test_the_config_refuses_loops_no_worker_could_run(tmp_path, change, expected):
    with pytest.raises(ValidationError) as raised:
        load_config(_config(tmp_path, ROWS, **change))
    assert expected in str(raised.value)


def test_a_custom_loop_that_imports_nothing_is_found_before_servers_start(tmp_path):
    config = load_config(_config(tmp_path, ROWS, loops={"revise": {"path": "tests.agent.custom_loops:Missing"}}))
    with pytest.raises(RolloutError, match=r"loops\.revise: tests\.agent\.custom_loops:Missing cannot be imported "
                       r"\(AttributeError"):
        check_loops(config, to_samples(read_rows(config.dataset), config.dataset, 1))
