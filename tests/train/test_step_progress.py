"""What `agentloop train` says about an async step: no `nan` in its line when every token is a version old (the
logprob check has nothing of the trainer's version to compare: it says `stale`), the rollout correction's weights
in the line, the metrics and the report, and the rollout correction's settings as the config resolves them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from agentloop_grpc.agent import WorkerSpec
from agentloop_grpc.integrations.trl import AsyncAgentLoopRollout, StepRecord, WeightSyncCallback
from agentloop_grpc.train.config import TrainConfig
from agentloop_grpc.train.progress import progress_line
from agentloop_grpc.train.record import TrainRecord
from agentloop_grpc.train.report import _correction_lags, _pipeline
from agentloop_grpc.train.run import StepLog

ROWS = [{"id": "a", "messages": [{"role": "user", "content": "What is 1 + 2?"}]}]
#: An async step's rollout metrics: both trajectories a version old, so the logprob check compared nothing.
ASYNC_STEP = {
    "reward_mean": 0.5, "correct_rate": 0.5, "valid_call_rate": 1.0, "rollout_s": 0.2, "trajectories": 2.0,
    "failures": 0.0, "stale_tokens": 12.0, "staleness_0": 0.0, "staleness_1": 2.0, "staleness_mean": 1.0,
    "staleness_max": 1.0, "queue_groups": 1.0, "trainer_idle_s": 0.1, "engine_idle_s": 0.0,
}
CORRECTION_LOGS = {
    "correction/ratio_mean": 0.97, "correction/ratio_min": 0.41, "correction/ratio_max": 2.6,
    "correction/truncated_share": 0.08, "correction/count": 12.0, "correction/lag_1/ratio_mean": 0.97,
    "correction/lag_1/ratio_min": 0.41, "correction/lag_1/ratio_max": 2.6, "correction/lag_1/truncated_share": 0.08,
    "correction/lag_1/count": 12.0, "correction/excluded_constrained_tokens": 0.0,
}


def test_an_async_steps_line_says_stale_not_nan_and_shows_the_weights(tmp_path):
    rollout = AsyncAgentLoopRollout(WorkerSpec(engines=("127.0.0.1:1",)), ROWS)  # never started
    rollout.history.append(StepRecord(1, (), 0.2, dict(ASYNC_STEP)))
    sync = WeightSyncCallback(rollout)
    record = TrainRecord(tmp_path)
    lines: list[str] = []
    log = StepLog(rollout, sync, record, lines.append)
    log.on_log(SimpleNamespace(max_steps=2), SimpleNamespace(global_step=1), None,
               logs={"loss": 0.1, "grad_norm": 0.5, **CORRECTION_LOGS})
    (line,) = lines
    assert "nan" not in line, line
    assert "|dlogp| stale" in line and "IS 0.97 [0.41, 2.60] cut 8%" in line, line
    assert record.steps[0]["correction/lag_1/ratio_max"] == 2.6  # into metrics.jsonl and the report's plot
    assert _correction_lags(record.steps) == [1]
    assert _pipeline(record.steps, tmp_path / "pipeline.png") and (tmp_path / "pipeline.png").stat().st_size > 0


def test_the_line_says_why_there_is_no_logprob_difference():
    sync_step = {k: v for k, v in ASYNC_STEP.items() if not k.startswith(("staleness", "queue"))}
    entry = {**sync_step, "train_s": 1.0, "weight_sync_s": 0.1}
    assert "|dlogp| off" in progress_line(1, 2, entry, checked=False)
    assert "|dlogp| -" in progress_line(1, 2, entry, checked=True)  # nothing scorable
    assert "|dlogp| 1.2e-03" in progress_line(1, 2, {**entry, "logprob_diff_sampler_max": 1.2e-3}, checked=True)
    assert "IS constrained" in progress_line(1, 2, {**entry, "correction/count": 0.0,
                                                    "correction/excluded_constrained_tokens": 9.0}, checked=True)


def test_the_correction_is_on_in_async_and_off_in_sync_by_default():
    def config(**fields) -> TrainConfig:
        return TrainConfig.model_validate({"engines": {"addresses": ["127.0.0.1:1"]},
                                           "dataset": {"arithmetic": {"count": 2}}, **fields})

    assert config().correction.resolved("sync") is None
    on = config(mode="async").correction.resolved("async")
    assert on is not None and (on.mode, on.high, on.constrained) == ("token_truncate", 2.0, "exclude")
    assert config(correction={"enabled": True}).correction.resolved("sync") is not None
    assert config(mode="async", correction={"enabled": False}).correction.resolved("async") is None
    with pytest.raises(ValidationError, match="decoupled"):
        config(correction={"mode": "decoupled", "low": 0.5})
