"""`agentloop train` with `trainer: trl_async`: TRL's AsyncGRPOTrainer on the real model, on this CPU (its two
CUDA parts replaced by the integration's fallbacks), two steps with the step line, metrics and report of
`mode: async`, and no `nan` in its log; the train process never imports vLLM."""

from __future__ import annotations

import json

import pytest

from .test_train_cli import _config, run_train


@pytest.mark.slow
def test_trl_async_trains_two_steps_with_the_async_metrics_and_report(tmp_path):
    config = _config(tmp_path, trainer="trl_async", max_staleness=1, report_to=[], check_logprobs=1,
                     save_model=False,
                     loop={"constrain_tool_calls": False, "max_assistant_turns": 2, "max_parallel_tool_calls": 1,
                           "max_new_tokens_per_turn": 16, "response_budget": 128, "drift_check": "off",
                           "sampling": {"temperature": 1.0, "seed": 0}})
    result, imported = run_train(config, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # its weight transfer (ours replaces it) imports vLLM wherever it is installed: not in this process
    assert "trl.experimental.async_grpo.weight_transfer" in imported
    assert "vllm" not in {m.partition(".")[0] for m in imported}
    lines = result.stdout.splitlines()
    assert "nan" not in result.stdout.lower(), result.stdout
    # chosen on this CPU, and said once
    assert sum("AsyncGRPOTrainer: tree attention by SDPA (no CUDA device" in line for line in lines) == 1
    assert sum("AsyncGRPOTrainer: MFU not computed" in line for line in lines) == 1
    step_lines = [line for line in lines if line.startswith("step ")]
    assert len(step_lines) == 2, result.stdout
    assert all("|dlogp| off" in line and "staleness<=" in line and "IS trainer's clip, ratio" in line
               for line in step_lines), step_lines
    out = tmp_path / "out"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["trajectories"] == 2 and step["staleness_max"] <= 1 and step["dropped_stale"] == 0
        assert step["train_s"] > 0 and step["weight_sync_s"] > 0 and step["policy_ratio_mean"] > 0
        assert "trainer_idle_s" in step and "engine_idle_s" in step and "queue_groups" in step
    assert steps[0]["policy_ratio_mean"] == pytest.approx(1.0, abs=1e-2)  # its first samples are its own weights'
    assert steps[0]["policy_kl"] < 1e-2
    history = json.loads((out / "trl_log_history.json").read_text())
    assert not any(key.startswith("perf/mfu") for h in history for key in h)  # absent, not a made-up number
    assert any(h.get("agentloop/groups_total") for h in history)  # the worker's metrics reached TRL's logs
    assert all(h.get("sample/dropped_stale_total", 0) == 0 for h in history)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer"] == "trl_async" and summary["mode"] == "async" and summary["steps"] == 2
    # the cold push at train begin, then one after each step
    assert set(summary["engine_weight_versions"].values()) == {3}
    report = (out / "report.html").read_text()
    assert "TRL AsyncGRPOTrainer" in report and "pipeline.png" in report and (out / "pipeline.png").is_file()


def _config_of(**fields):
    from agentloop_grpc.train.config import TrainConfig

    return TrainConfig.model_validate({"engines": {"addresses": ["127.0.0.1:1"]},
                                       "dataset": {"arithmetic": {"count": 2}}, **fields})


def test_trl_async_implies_async_and_refuses_what_only_grpo_trainer_has():
    from pydantic import ValidationError

    assert _config_of(trainer="trl_async").mode == "async"
    assert _config_of().trainer == "trl" and _config_of().mode == "sync"
    for fields, name in [({"mode": "sync"}, "mode: async"), ({"grpo": {"beta": 0.1}}, "grpo.beta"),
                         ({"grpo": {"loss_type": "grpo"}}, "grpo.loss_type"),
                         ({"correction": {"enabled": True}}, "correction.enabled"),
                         ({"loop": {"constrain_tool_calls": True}}, "loop.constrain_tool_calls"),
                         ({"max_staleness": 0}, "max_staleness: 0")]:
        with pytest.raises(ValidationError, match=name.replace(".", r"\.")):
            _config_of(trainer="trl_async", **fields)
