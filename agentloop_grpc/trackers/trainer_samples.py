"""The samples table of a training run: each step, the step's first trajectories (prompt, response, reward,
termination, error) go to the trackers the Trainer's own callbacks opened: a text summary beside their TensorBoard
events, a ``wandb.Table`` in the active W&B run, a ``log_table`` artifact in the active MLflow run. TRL's own
completions table covers W&B only and prints to the console, so it stays off."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from .base import SampleRow

if TYPE_CHECKING:
    from .tensorboard import TensorBoardTracker


class TrainerSampleTables(TrainerCallback):
    def __init__(self, names: Sequence[str], tensorboard_dir: Path, rows: Callable[[], Sequence[SampleRow]]) -> None:
        self.names, self.tensorboard_dir, self.rows = tuple(names), tensorboard_dir, rows
        self._board: TensorBoardTracker | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return  # the closing summary log, or a log before any step
        rows = self.rows()
        if not rows:
            return
        step = state.global_step
        if "tensorboard" in self.names:
            if self._board is None:
                from .tensorboard import TensorBoardTracker

                self._board = TensorBoardTracker(self.tensorboard_dir)
            self._board.log_samples(rows, step)
        if "wandb" in self.names:
            import wandb

            from .wandb import samples_table

            if wandb.run is not None:  # the Trainer's W&B callback started it at train begin
                wandb.run.log({"samples": samples_table(rows), "train/global_step": step})
        if "mlflow" in self.names:
            import mlflow

            from .mlflow import samples_columns, samples_file

            if mlflow.active_run() is not None:  # the Trainer's MLflow callback started it at train begin
                mlflow.log_table(samples_columns(rows), artifact_file=samples_file(step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._board is not None:
            self._board.close()
