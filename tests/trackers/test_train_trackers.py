"""report_to for `agentloop train`: our trackers section becomes what the Trainer's tracker callbacks read, and
those callbacks run after ours, so the rollout metrics we add to TRL's logs reach the trackers (a real Trainer on a
tiny random model logging to real TensorBoard files; the full training run is tests/train/test_train_cli.py)."""

from __future__ import annotations

import os
from pathlib import Path

from agentloop_grpc.trackers import SampleRow, TrackerSettings
from agentloop_grpc.trackers.trainer_env import scoped_environ, trainer_environ
from agentloop_grpc.trackers.trainer_samples import TrainerSampleTables
from agentloop_grpc.train.run import rollout_log_metrics, trackers_last

from .wandb_records import history


def test_the_trackers_section_becomes_the_callbacks_environment(tmp_path: Path):
    settings = TrackerSettings(project="p", tensorboard={"logdir": str(tmp_path / "tb")}, wandb={"entity": "team"})
    env = trainer_environ(["tensorboard", "wandb", "mlflow"], settings, tmp_path, {"WANDB_MODE": "offline"})
    assert env == {
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb"),
        "WANDB_PROJECT": "p", "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_ENTITY": "team",
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").resolve().as_uri(), "MLFLOW_EXPERIMENT_NAME": "p",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }
    assert trainer_environ([], settings, tmp_path, {}) == {}


def test_scoped_environ_restores_what_was_there(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    with scoped_environ({"WANDB_MODE": "offline", "WANDB_DIR": "/tmp/x"}):
        assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_DIR"] == "/tmp/x"
    assert os.environ["WANDB_MODE"] == "online" and "WANDB_DIR" not in os.environ


def test_rollout_metrics_join_the_logs_but_not_those_trl_logs():
    entry = {"step": 3, "reward_mean": 0.5, "correct_rate": 0.25, "frac_groups_zero_std": 1.0, "stale_tokens": 0.0,
             "train_s": 1.5, "weight_sync_s": 0.2, "loss": 0.1}
    rollout_keys = ["reward_mean", "correct_rate", "frac_groups_zero_std", "stale_tokens"]
    assert rollout_log_metrics(entry, rollout_keys) == {
        "agentloop/correct_rate": 0.25, "agentloop/stale_tokens": 0.0, "agentloop/train_s": 1.5}


def test_the_tracker_callbacks_see_what_our_callbacks_add(tmp_path: Path, monkeypatch):
    """A real Trainer (tiny random model) with TensorBoard, W&B offline and MLflow: our metrics reach all three,
    and so does the samples table."""
    import mlflow
    import torch
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback

    class AddsRolloutMetrics(TrainerCallback):  # what StepLog does to the logs, without a rollout behind it
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs["agentloop/correct_rate"] = 0.75

    monkeypatch.setenv("WANDB_SILENT", "true")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    settings = TrackerSettings(project="train-trackers", wandb={"mode": "offline"})
    names = ["tensorboard", "wandb", "mlflow"]
    rows = [SampleRow("s/0", "What is 2 + 2?", "4", 1.0, "stop", ""), SampleRow("s/1", "p", "r|x", 0.0, "length", "")]
    with scoped_environ(trainer_environ(names, settings, tmp_path)):
        args = TrainingArguments(output_dir=str(tmp_path / "trl"), report_to=names, run_name="tiny", use_cpu=True,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args)
        trainer.add_callback(AddsRolloutMetrics())
        tables = TrainerSampleTables(names, settings.tensorboard_dir(tmp_path), lambda: rows)
        trainer.add_callback(tables)
        trackers_last(trainer)
        trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)  # the trackers open their runs
        trainer.state.global_step = 1
        trainer.log({"loss": 0.5})
        run_id = mlflow.active_run().info.run_id
        trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)
        wandb.finish()
        wandb.teardown()  # finish returns before wandb's service has written the run's last records: wait for it
        client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        artifacts = [a.path for a in client.list_artifacts(run_id)]
        metrics = client.get_run(run_id).data.metrics
    assert {type(c) for c in trainer.callback_handler.callbacks[-3:]} == {TensorBoardCallback, WandbCallback,
                                                                          MLflowCallback}
    events = EventAccumulator(str(settings.tensorboard_dir(tmp_path)), size_guidance={"tensors": 0})
    events.Reload()
    assert {"train/loss", "train/agentloop/correct_rate"} <= set(events.Tags()["scalars"])
    assert events.Scalars("train/agentloop/correct_rate")[0].value == 0.75
    (table,) = events.Tensors("samples")
    assert table.step == 1 and "| s/1 | p | r\\|x | 0.0 | length |  |" in table.tensor_proto.string_val[0].decode()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # WANDB_DIR and WANDB_MODE reached wandb.init
    logged = history(run_dir)
    assert any(row.get("train/agentloop/correct_rate") == 0.75 for row in logged), logged
    assert any(row.get("samples/nrows") == 2 and row.get("train/global_step") == 1 for row in logged)
    assert metrics["agentloop/correct_rate"] == 0.75 and "samples_step_1.json" in artifacts
