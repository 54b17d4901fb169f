"""A training run whose every trajectory failed ends non-zero, as a failed rollout does, with the error causes and
no ratio; the trajectories ran the config's ``dataset.default_loop`` (the CLI in its own process: a fake engine it
launches, TRL's trainer on the default model). With ``trainer: trl_async`` too, which can take no step at all (no
sample to train): it stops at once rather than wait for samples that never come."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentloop_grpc.rollout.command import EXIT_TOO_MANY_FAILED

from .broken_loops import PATH

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


# trl_async: the two groups of two that max_staleness 1 admits before its first step, and one in place of the
# first (a window of two in a row gave no sample: it admits no more)
@pytest.mark.parametrize(("trainer", "trajectories"), [({}, 2), ({"trainer": "trl_async"}, 6)],
                         ids=["trl", "trl_async"])
def test_a_run_whose_every_trajectory_failed_exits_3_naming_the_cause(tmp_path, trainer, trajectories):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}) + "\n")
    out = tmp_path / "out"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "fake", "vocab_size": 49152}}},
        "tools": {"launch": None},
        "dataset": {"path": str(data), "default_loop": "broken"},
        "loops": {"broken": {"path": f"{PATH}:FailEveryRun"}},
        "loop": {"max_new_tokens_per_turn": 8, "constrain_tool_calls": False, "sampling": {"temperature": 1.0,
                                                                                         "seed": 0}},
        "grpo": {"max_steps": 1, "prompts_per_step": 1, "num_generations": 2, "trainable_layers": 1},
        "check_logprobs": 0,
        "report_to": [],
        "save_model": False,
        "output_dir": str(out),
        **trainer,
    }))
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "train", "--config", str(config)],
                            capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == EXIT_TOO_MANY_FAILED, result.stderr[-3000:]
    assert "RATIO" not in result.stdout  # (the stderr has the loop's traceback, logged by the worker per sample)
    # the default loop ran: every trajectory failed with its error, counted among the causes
    assert f"  {trajectories} x internal error: RuntimeError: this loop fails every trajectory" in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {trajectories} of {trajectories} trajectories failed (100%)") and str(out) in line
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()  # the outputs are written
    (causes,) = [line for line in result.stderr.splitlines() if line.startswith("error causes")]
    if trainer:
        assert f"AsyncGRPOTrainer stopped before its first step: every one of the {trajectories}" in result.stdout
        assert not (out / "metrics.jsonl").exists() and "metrics.jsonl" not in causes  # no step: none to point to
    else:
        assert (out / "metrics.jsonl").is_file() and "metrics.jsonl" in causes
