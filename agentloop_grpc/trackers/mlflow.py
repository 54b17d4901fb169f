"""MLflow: metrics with their step, the samples table as a JSON artifact (``log_table``), the flat config as
params. A local folder store (the default, OUTPUT_DIR/mlruns) is what MLflow 3 calls its file backend: it keeps
working behind the opt-out variable, set only while the store is opened."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from urllib.parse import urlparse

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus

from .base import SAMPLE_COLUMNS, SampleRow

#: MLflow's params are short strings; longer values are cut to this many characters.
_PARAM_CHARS = 500


class MlflowTracker:
    def __init__(self, tracking_uri: str, experiment: str, run_name: str, params: Mapping[str, object]) -> None:
        with _file_store_allowed(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.where = f"MLflow run {self.run_id} in {tracking_uri}"
        # the client splits a long list into the batches its store takes
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:_PARAM_CHARS]) for k, v in params.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_samples(self, rows: Sequence[SampleRow], step: int) -> None:
        self.client.log_table(self.run_id, data=samples_columns(rows), artifact_file=samples_file(step))

    def close(self) -> None:
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))


def samples_columns(rows: Sequence[SampleRow]) -> dict[str, list]:
    """The rows as log_table's column mapping."""
    return {name: [row.values()[i] for row in rows] for i, name in enumerate(SAMPLE_COLUMNS)}


def samples_file(step: int) -> str:
    return f"samples_step_{step}.json"


@contextmanager
def _file_store_allowed(tracking_uri: str) -> Iterator[None]:
    """MLflow 3 refuses a folder store unless MLFLOW_ALLOW_FILE_STORE is set; the store is built (and cached) on
    the first call, so the variable is set around it only, and only for a folder."""
    if urlparse(tracking_uri).scheme not in ("", "file") or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
