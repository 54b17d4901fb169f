"""A replica lost in the middle of `agentloop train` with `engines.launch.restart_lost`: the launcher starts it
again, the run's Routers hold it out while it serves the initial weights, the next push brings it the trainer's
(only the trained parameters move: the frozen ones are the checkpoint it loaded) and it serves the last steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psutil
import pytest
import yaml

from agentloop_grpc.agent import read_parquet
from tests.rollout.launching import discovered

pytestmark = pytest.mark.slow

STEPS = 5


def test_a_replica_killed_between_steps_comes_back_on_the_trainers_weights(tmp_path):
    out = tmp_path / "out"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Count to {i}."}]})
                            + "\n" for i in range(8)))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        # fake replicas, 16 tokens at 0.2 s: each step's rollout takes 3.2 s at least, so the replica has steps 2 to
        # 4 to come back before step 4's push, after which step 5's rollout uses it
        "engines": {"launch": {"replicas": 2, "restart_lost": True,
                               "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.2}}},
        # short single-turn prompts without tools: each step trains on a few dozen tokens, not the tools' ~450
        "tools": {"launch": None},
        "dataset": {"path": str(rows), "default_loop": "single_turn"},
        "loop": {"max_new_tokens_per_turn": 16, "drift_check": "off", "sampling": {"temperature": 1.0, "seed": 0}},
        "grpo": {"max_steps": STEPS, "prompts_per_step": 2, "num_generations": 2, "trainable_layers": 1},
        "check_logprobs": 0,
        "report_to": [],
        "save_model": False,
        "output_dir": str(out),
    }))
    errors = tmp_path / "stderr.log"
    with errors.open("w") as stderr_file:
        process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "train", "--config", str(config)],
                                   stdout=subprocess.PIPE, stderr=stderr_file, text=True,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    before = None
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step   1/") and before is None:  # the engines hold version 1 now
                before = discovered(out / "discovery.json")
                (replica,) = [p for p in psutil.Process(process.pid).children() if "dp_rank=1" in p.cmdline()]
                replica.kill()
        assert process.wait(timeout=300) == 0, errors.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert before is not None, "".join(lines)
    assert sum(line.startswith("step ") for line in lines) == STEPS
    log = errors.read_text()
    after = discovered(out / "discovery.json")
    assert after[0] == before[0] and after[1] != before[1], (before, after)
    assert f"engine server {before[1]} (dp rank 1) lost: its process was killed by SIGKILL" in log, log[-3000:]
    assert f"engine server dp rank 1 restarted at {after[1]}" in log, log[-3000:]
    # back on version 0: no Router sent it work until a push reached it
    assert re.search(rf"server {after[1]} serves weight version 0, the fleet \d: held out of routing", log), log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine_weight_versions"] == {before[0]: STEPS, after[1]: STEPS}, summary
    assert summary["infrastructure_failures"] == 0, summary
    served = {server for t in read_parquet(out / "trajectories.parquet") for server in t.servers}
    assert after[1] in served, served  # the last step's rollout used it
