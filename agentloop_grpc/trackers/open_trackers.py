"""``open_trackers``: the trackers of ``report_to``, opened for one run, behind one object that logs to all."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .base import SampleRow, Tracker
from .config import TrackerSettings, resolve_report_to


class TrackerError(RuntimeError):
    """A tracker of report_to could not start (no W&B login, an unwritable folder, ...); one sentence."""


class Trackers:
    """Every open tracker of a run (none: every call does nothing); closes them all, also after an error."""

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        self.trackers = dict(trackers)

    @property
    def names(self) -> list[str]:
        return list(self.trackers)

    def locations(self) -> list[str]:
        """Where to look at the run, one line per tracker."""
        return [f"{name}: {tracker.where}" for name, tracker in self.trackers.items()]

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers.values():
            tracker.log_metrics(metrics, step)

    def log_samples(self, rows: Sequence[SampleRow], step: int) -> None:
        if rows:
            for tracker in self.trackers.values():
                tracker.log_samples(rows, step)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trackers(names: Sequence[str] | None, settings: TrackerSettings, output_dir: str | Path,
                  config: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> Trackers:
    """Open the trackers ``names`` (a config's report_to; None: the default) for a run writing to ``output_dir``;
    ``config`` is the run's config as flat key/values (W&B config, MLflow params). Each tracker module is imported
    only when named, so an uninstalled one costs nothing. TrackerError when one cannot start."""
    out = Path(output_dir)
    run_name = settings.name_of_run(out)

    def tensorboard() -> Tracker:
        from .tensorboard import TensorBoardTracker

        return TensorBoardTracker(settings.tensorboard_dir(out))

    def wandb() -> Tracker:
        from .wandb import WandbTracker

        return WandbTracker(settings.project, run_name, settings.wandb_mode(environ), out, settings.wandb.entity,
                            config)

    def mlflow() -> Tracker:
        from .mlflow import MlflowTracker

        return MlflowTracker(settings.mlflow_uri(out, environ), settings.project, run_name, config)

    openers: dict[str, Callable[[], Tracker]] = {"tensorboard": tensorboard, "wandb": wandb, "mlflow": mlflow}
    opened = Trackers({})
    try:
        for name in resolve_report_to(names):
            try:
                opened.trackers[name] = openers[name]()
            # each tool raises its own classes (wandb's UsageError, MlflowException, OSError): one sentence for all
            except Exception as error:
                cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise TrackerError(f"report_to {name} could not start: {cause}") from error
    except BaseException:
        opened.close()  # the ones already open
        raise
    return opened


def flatten(document: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """A nested config as ``a.b.c: value`` pairs (what W&B config and MLflow params show best)."""
    flat: dict[str, object] = {}
    for key, value in document.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
