"""``report_to`` for training: TRL's GRPOTrainer logs through the transformers Trainer's own tracker callbacks,
which read their settings from environment variables; this maps our ``trackers`` section onto them, so a train
config and a rollout config with the same section log to the same places."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from .config import TrackerSettings


def trainer_environ(names: Sequence[str], settings: TrackerSettings, output_dir: str | Path,
                    environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables the Trainer's TensorBoard, W&B and MLflow callbacks read, for the trackers ``names``."""
    out = Path(output_dir)
    env: dict[str, str] = {}
    if "tensorboard" in names:
        env["TENSORBOARD_LOGGING_DIR"] = str(settings.tensorboard_dir(out))
    if "wandb" in names:
        env |= {"WANDB_PROJECT": settings.project, "WANDB_MODE": settings.wandb_mode(environ), "WANDB_DIR": str(out)}
        if settings.wandb.entity:
            env["WANDB_ENTITY"] = settings.wandb.entity
    if "mlflow" in names:
        uri = settings.mlflow_uri(out, environ)
        env |= {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": settings.project}
        if urlparse(uri).scheme in ("", "file"):
            env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses a folder store without it
    return env


@contextmanager
def scoped_environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in os.environ for the block, then restore what was there (the callbacks read it lazily)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
