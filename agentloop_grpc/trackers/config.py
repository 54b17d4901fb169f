"""``report_to`` and the ``trackers`` section of the rollout and train configs: which experiment trackers a run
logs to and how. Every field has a default that works offline on one machine; a tracker that is not installed is
a config error naming the extra that installs it, found when the config is read, not after servers started."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(frozen=True, extra="forbid")

TrackerName = Literal["tensorboard", "wandb", "mlflow", "none"]

#: The modules each tracker imports; the extra of the same name installs them (`pip install 'agentloop-grpc[NAME]'`).
#: MLflow's log_table builds a pandas DataFrame, and mlflow-skinny does not depend on pandas.
TRACKER_MODULES = {"tensorboard": ("tensorboard",), "wandb": ("wandb",), "mlflow": ("mlflow", "pandas")}

REPORT_TO_HELP = (
    "Trackers the run logs to, among tensorboard, wandb and mlflow ([none] or []: none). Default (null): "
    "tensorboard when it is installed, else none. Each needs its extra: pip install 'agentloop-grpc[NAME]'."
)


def missing(name: str) -> list[str]:
    """The modules of the tracker ``name`` that cannot be imported (find_spec: nothing heavy is imported)."""
    return [module for module in TRACKER_MODULES[name] if importlib.util.find_spec(module) is None]


def installed(name: str) -> bool:
    return not missing(name)


def check_report_to(names: tuple[TrackerName, ...] | None) -> tuple[TrackerName, ...] | None:
    """The validator both configs share: no repeats, none alone, each tracker installed."""
    if names is None:
        return None
    if "none" in names and len(names) > 1:
        raise ValueError("none means no tracker: give it alone")
    if len(set(names)) != len(names):
        raise ValueError(f"{list(names)} names a tracker twice")
    for name in names:
        if name != "none" and (absent := missing(name)):
            raise ValueError(f"{name} is not installed (no {', '.join(absent)}): pip install 'agentloop-grpc[{name}]'")
    return names


def resolve_report_to(names: tuple[TrackerName, ...] | None) -> tuple[str, ...]:
    """The trackers a run opens: the configured ones without none, or the default (tensorboard if installed)."""
    if names is None:
        return ("tensorboard",) if installed("tensorboard") else ()
    return tuple(name for name in names if name != "none")


class TensorBoardSettings(BaseModel):
    """TensorBoard: event files in a folder (`tensorboard --logdir FOLDER`)."""

    model_config = _STRICT

    logdir: str | None = Field(None, description="Folder of the event files (default: OUTPUT_DIR/tensorboard).")


class WandbSettings(BaseModel):
    """Weights & Biases: a run in the project `trackers.project`."""

    model_config = _STRICT

    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="online: sync while running (needs `wandb login`); offline: write OUTPUT_DIR/wandb only "
        "(`wandb sync` later); default: $WANDB_MODE, else online.")
    entity: str | None = Field(None, description="Team or user owning the project (default: your W&B default).")


class MlflowSettings(BaseModel):
    """MLflow: a run in the experiment `trackers.project`."""

    model_config = _STRICT

    tracking_uri: str | None = Field(
        None, description="Tracking server or store (default: $MLFLOW_TRACKING_URI, else the local folder "
        "OUTPUT_DIR/mlruns; `mlflow ui --backend-store-uri OUTPUT_DIR/mlruns` shows it).")


class TrackerSettings(BaseModel):
    """How the trackers of `report_to` name and fill the run (docs/trackers.md)."""

    model_config = _STRICT

    run_name: str | None = Field(None, description="Run name (default: the output_dir folder's name and the UTC "
                                 "start time).")
    project: str = Field("agentloop", min_length=1, description="W&B project and MLflow experiment.")
    log_every: int = Field(8, ge=1, le=100_000, description="Rollout: every this many finished trajectories, log "
                           "their metrics (the step is the count of finished trajectories).")
    samples: int = Field(16, ge=0, le=10_000, description="Trajectories in the samples table (prompt, response, "
                         "reward, termination, error): a rollout's at its end, a training run's every step; 0: none.")
    tensorboard: TensorBoardSettings = Field(default_factory=TensorBoardSettings, description="TensorBoard.")
    wandb: WandbSettings = Field(default_factory=WandbSettings, description="Weights & Biases.")
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings, description="MLflow.")

    @field_validator("run_name")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("a run name is not blank (null: the default)")
        return value

    def name_of_run(self, output_dir: str | Path) -> str:
        """The run name: the configured one, or the output folder's name and the UTC time."""
        if self.run_name is not None:
            return self.run_name
        return f"{Path(output_dir).resolve().name}-{datetime.now(UTC):%Y%m%d-%H%M%S}"

    def tensorboard_dir(self, output_dir: str | Path) -> Path:
        return Path(self.tensorboard.logdir) if self.tensorboard.logdir else Path(output_dir) / "tensorboard"

    def mlflow_uri(self, output_dir: str | Path, environ: Mapping[str, str]) -> str:
        """The MLflow tracking URI: configured, else $MLFLOW_TRACKING_URI, else a local folder under output_dir."""
        return (self.mlflow.tracking_uri or environ.get("MLFLOW_TRACKING_URI")
                or (Path(output_dir).resolve() / "mlruns").as_uri())

    def wandb_mode(self, environ: Mapping[str, str]) -> str:
        """The W&B mode: configured, else $WANDB_MODE, else online (W&B's own default)."""
        return self.wandb.mode or environ.get("WANDB_MODE") or "online"
