"""Weights & Biases: metrics into the run's history, the samples table as a ``wandb.Table``; offline mode writes
the run under OUTPUT_DIR/wandb for ``wandb sync`` later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import wandb

from .base import SAMPLE_COLUMNS, SampleRow


class WandbTracker:
    def __init__(self, project: str, run_name: str, mode: str, directory: Path, entity: str | None,
                 config: Mapping[str, object]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, mode=mode, dir=str(directory), entity=entity,
                              config=dict(config), reinit="create_new")
        # an offline run has no page yet: it is synced from its folder
        self.where = self.run.url if mode == "online" else f"wandb sync {Path(self.run.dir).parent}"

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_samples(self, rows: Sequence[SampleRow], step: int) -> None:
        self.run.log({"samples": samples_table(rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


def samples_table(rows: Sequence[SampleRow]) -> wandb.Table:
    return wandb.Table(columns=list(SAMPLE_COLUMNS), data=[list(row.values()) for row in rows])
