"""`agentloop rollout` with report_to: one real run (fake engines launched by the CLI, the built-in tool server)
logs to TensorBoard, W&B (offline) and MLflow (a folder store) at once, and serves the Router's metrics while it
runs; each tracker's files are read back with that tool's own reader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from agentloop_grpc.agent import read_parquet

from .wandb_records import history

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
TRAJECTORIES = 8  # 4 prompts x 2 samples
LOG_EVERY = 3


def _config(tmp_path: Path) -> Path:
    config = {
        # a slow decode step keeps the run going for a few seconds: the metrics endpoint is scraped meanwhile
        "engines": {"launch": {"replicas": 1,
                               "engine": {"kind": "fake", "vocab_size": 49152, "token_latency_s": 0.03}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"count": 4, "seed": 1}},
        "samples_per_prompt": 2,
        "loop": {"max_new_tokens_per_turn": 16, "sampling": {"temperature": 1.0, "seed": 3}},
        "report_to": ["tensorboard", "wandb", "mlflow"],
        "trackers": {"run_name": "tracked", "project": "trackers-test", "log_every": LOG_EVERY, "samples": 3,
                     "wandb": {"mode": "offline"}},
        "metrics_port": 0,
        "report": False,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _scrape_during(process: subprocess.Popen) -> tuple[str, str]:
    """What the run printed up to the metrics URL, and a scrape of that URL taken once the router has routed a
    request (the endpoint lives only as long as the run: a successful scrape is one during the rollout)."""
    url, printed = None, ""
    for line in process.stdout:
        printed += line
        if match := re.search(r"router metrics at (http://127\.0\.0\.1:\d+/metrics)", line):
            url = match.group(1)
            break
    assert url, "the run printed no metrics URL"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        if "agentloop_router_routing_decisions_total{" in text:
            return printed, text
        time.sleep(0.1)
    raise AssertionError(f"no routing decision in {url} within the deadline")


@pytest.mark.slow
def test_a_rollout_logs_to_every_tracker_and_serves_router_metrics(tmp_path, monkeypatch):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
    env.pop("WANDB_MODE", None)
    process = subprocess.Popen([*AGENTLOOP, "rollout", "--config", str(_config(tmp_path))], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        printed, scraped = _scrape_during(process)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "logging to tensorboard, wandb, mlflow" in printed and "rollout summary" in stdout
    out = tmp_path / "out"
    assert f"tensorboard: tensorboard --logdir {out / 'tensorboard'}" in stdout
    assert f"wandb: wandb sync {out / 'wandb'}/offline-run-" in stdout and "mlflow: MLflow run " in stdout
    assert 'agentloop_router_in_flight{server="127.0.0.1:' in scraped
    summary = json.loads((out / "summary.json").read_text())
    trajectories = {t.sample_id: t for t in read_parquet(out / "trajectories.parquet")}
    steps = [*range(LOG_EVERY, TRAJECTORIES + 1, LOG_EVERY), TRAJECTORIES]  # 3, 6 and the last window at 8

    # TensorBoard: the event files, read with its EventAccumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("rollout/mean_reward")] == steps
    # the windows partition the run: their tokens add up to the whole run's
    assert sum(e.value for e in events.Scalars("rollout/model_tokens")) == summary["model_tokens"]
    assert events.Scalars("summary/mean_reward")[0].value == pytest.approx(summary["mean_reward"])
    (table,) = events.Tensors("samples")
    text = table.tensor_proto.string_val[0].decode()
    assert text.startswith("| sample_id | prompt | response | reward | termination | error |")
    assert len(text.splitlines()) == 2 + 3 and "arith-1-0" in text

    # W&B offline: the run's history records
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    rows = history(run_dir)
    assert [r["_step"] for r in rows if "rollout/mean_reward" in r] == steps
    assert any(r.get("summary/trajectories") == TRAJECTORIES for r in rows)
    (table_row,) = [r for r in rows if "samples/_type" in r]
    assert table_row["samples/_type"] == "table-file" and table_row["samples/nrows"] == 3
    table_file = json.loads((run_dir / "files" / table_row["samples/path"]).read_text())
    assert table_file["columns"] == ["sample_id", "prompt", "response", "reward", "termination", "error"]
    sample_id, prompt, response, reward, termination, error = table_file["data"][0]
    assert sample_id == "arith-1-0/0" and prompt and response and termination and error == ""
    assert reward == trajectories["arith-1-0/0"].reward

    # MLflow: the folder store, read with MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a folder store only with it
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("trackers-test").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/mean_reward")] == steps
    assert run.data.params["samples_per_prompt"] == "2"
    (artifact,) = [a.path for a in client.list_artifacts(run.info.run_id) if a.path.startswith("samples")]
    assert artifact == f"samples_step_{TRAJECTORIES}.json"
