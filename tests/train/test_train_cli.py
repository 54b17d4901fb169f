"""`agentloop train` end to end on the real model (an embedded engine process launched by the CLI, the built-in
tool server, TRL's GRPOTrainer), its outputs, the closing RATIO line, and bad configs refused in one sentence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.cli.commands import app
from agentloop_grpc.train.run import reward_ratio

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]
IMPORT_LINE = "import time:"


def run_train(config: Path, timeout: float) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`agentloop train --config config` in its own process: its result, and the modules it imported, which
    ``-X importtime`` lists on its stderr (those lines taken out of the result's; modules loaded by
    ``importlib.import_module``, as TRL's lazy top-level names are, are not listed, those they import are)."""
    result = subprocess.run([sys.executable, "-X", "importtime", *AGENTLOOP[1:], "train", "--config", str(config)],
                            capture_output=True, text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = result.stderr.splitlines(keepends=True)
    stderr = "".join(line for line in lines if not line.startswith(IMPORT_LINE))
    imported = {line.rpartition("|")[2].strip() for line in lines if line.startswith(IMPORT_LINE)}
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, stderr), imported


def _config(tmp_path: Path, **overrides) -> Path:
    config = {
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "embedded", "max_running": 4, "max_model_len": 1024}}},
        "tools": {"launch": "builtin"},
        "dataset": {"arithmetic": {"kind": "one_step", "count": 4, "seed": 0}},
        "loop": {"constrain_tool_calls": True, "max_assistant_turns": 2, "max_parallel_tool_calls": 1,
                 "max_new_tokens_per_turn": 24, "response_budget": 128, "drift_check": "off",
                 "sampling": {"temperature": 1.0, "seed": 0}},
        "grpo": {"max_steps": 2, "prompts_per_step": 1, "num_generations": 2, "trainable_layers": 1},
        "check_logprobs": 1,
        "report_to": ["tensorboard", "mlflow"],
        "trackers": {"run_name": "trained", "project": "train-test"},
        "output_dir": str(tmp_path / "out"),
    }
    config.update(overrides)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_train_writes_metrics_report_weights_and_the_ratio(tmp_path):
    result = subprocess.run([*AGENTLOOP, "train", "--config", str(_config(tmp_path))], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("RATIO train_reward_last_over_first ") and lines[-1].endswith(" target 1.5")
    assert sum(line.startswith("step ") for line in lines) == 2
    out = tmp_path / "out"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["weight_sync_s"] > 0 and step["rollout_s"] > 0 and step["train_s"] > 0
        assert step["stale_tokens"] == 0 and step["logprob_diff_sampler_max"] < 2e-3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine_weight_versions"] and set(summary["engine_weight_versions"].values()) == {2}
    assert summary["weight_transfer"] == "collective"  # the engine shares this machine: a group forms
    assert "weights reached the engines by collective" in result.stdout
    assert (out / "metrics.csv").is_file() and (out / "trl_log_history.json").is_file()
    assert (out / "reward_curve.png").is_file() and (out / "time_per_step.png").is_file()
    assert "reward_curve.png" in (out / "report.html").read_text()
    assert len(read_parquet(out / "trajectories.parquet")) == 2
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()
    _check_trackers(out, steps)


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return [d for c in children for d in (c, *_descendants(c))]


@pytest.mark.slow
def test_async_training_goes_on_when_an_engine_is_killed(tmp_path):
    """`mode: async` end to end on two replicas; one is SIGKILLed after the first step: its groups fail over to the
    other, the next weight push leaves it out, every step trains and the survivor ends on the last version."""
    config = _config(tmp_path, mode="async", max_staleness=1, report_to=[],
                     grpo={"max_steps": 2, "prompts_per_step": 1, "num_generations": 2, "trainable_layers": 1})
    document = yaml.safe_load(config.read_text())
    document["engines"]["launch"].update(replicas=2)
    document["engines"]["launch"]["engine"]["threads"] = 1
    config.write_text(yaml.safe_dump(document))
    errors = tmp_path / "stderr.log"
    with errors.open("w") as stderr_file:
        process = subprocess.Popen([*AGENTLOOP, "train", "--config", str(config)], stdout=subprocess.PIPE,
                                   stderr=stderr_file, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    killed = None
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step   1/") and killed is None:
                engines = [p for p in _descendants(process.pid)
                           if b"engine\x00serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
                assert len(engines) == 2, engines
                killed = engines[0]
                os.kill(killed, signal.SIGKILL)
        assert process.wait(timeout=300) == 0, errors.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert killed is not None
    assert sum(line.startswith("step ") for line in lines) == 2
    assert not [line for line in lines if "nan" in line]  # |dlogp| says stale when no token is the trainer's
    out = tmp_path / "out"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(s["trajectories"] == 2 and s["staleness_max"] <= 1 for s in steps)
    # the correction is on in async mode; the calls are constrained, so their tokens are left out of its ratio
    assert all(s["correction/excluded_constrained_tokens"] > 0 for s in steps)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "async" and summary["staleness_max"] <= 1
    assert list(summary["engine_weight_versions"].values()) == [2]  # the survivor, on the last weights
    assert "leaves out 1 engine(s) that do not answer" in errors.read_text()


def _check_trackers(out: Path, steps: list[dict]) -> None:
    """report_to reached TRL's trackers, and they logged our rollout metrics beside TRL's own, once per step."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]
    assert [e.step for e in events.Tensors("samples")] == [1, 2]  # each step's samples table
    assert [e.value for e in events.Scalars("train/agentloop/correct_rate")] == [s["correct_rate"] for s in steps]
    assert "train/agentloop/reward_mean" not in events.Tags()["scalars"]  # TRL's train/reward has it
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a folder store only with it
        client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("train-test").experiment_id])
        assert run.info.run_name == "trained"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "agentloop/valid_call_rate")] == [1, 2]
        tables = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples_step_1.json", "samples_step_2.json"} <= tables


def test_sampling_the_trainer_cannot_describe_is_refused(tmp_path):
    path = _config(tmp_path, loop={"sampling": {"temperature": 1.0, "top_p": 0.9}})
    # in this process: the config is refused before anything starts or is imported
    result = CliRunner().invoke(app, ["train", "--config", str(path)])
    assert result.exit_code == 2 and "top_p" in result.stderr and "Traceback" not in result.output, result.output


def test_reward_ratio_compares_the_last_steps_with_the_first():
    steps = [{"reward_mean": r} for r in (0.1, 0.2, 0.3, 0.3, 0.4, 0.6)]
    assert reward_ratio(steps, 2) == pytest.approx((0.15, 0.5, 0.5 / 0.15))
    assert reward_ratio(steps[:2], 5)[2] == pytest.approx(2.0)  # k shrinks to half the run
    assert reward_ratio([{"reward_mean": 0.0}] * 2, 1)[2] == 1.0


def test_small_metrics_keep_their_digits():
    from agentloop_grpc.train.run import _significant

    # per-step logprob differences are ~1e-6: rounding to decimals had made them 0 in metrics and the summary
    assert _significant(1.2345e-6) == pytest.approx(1.2345e-6, rel=1e-3) and _significant(14.7492) == 14.75
