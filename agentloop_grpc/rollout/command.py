"""``agentloop rollout --config FILE``: bad input ends with one clear sentence and a non-zero exit, never a
traceback; Ctrl-C stops the servers this run started and keeps the trajectories already finished.

Exit codes: 0 done; 1 the run could not start or go on; 2 bad command line or config; 3 the run finished but the
share of failed trajectories reached ``max_failed_share`` (outputs written, the top error causes printed);
130 interrupted."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
import yaml
from pydantic import BaseModel, ValidationError

from agentloop_grpc.agent.routing_check import RoutingUnavailableError
from agentloop_grpc.agent.tokenizer_check import TokenizerMismatchError
from agentloop_grpc.common.config_errors import describe, returned_model
from agentloop_grpc.launch.launcher import LaunchError
from agentloop_grpc.trackers import TrackerError

from .config import load_config
from .dataset import DatasetError
from .run import LoopConfigError, RolloutError, RunRecord, error_causes, run_rollout, summarize

T = TypeVar("T", bound=BaseModel)

#: The exit code of a run whose failed share reached max_failed_share (distinct from 1: the run itself went on).
EXIT_TOO_MANY_FAILED = 3


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_settings(config: Path, loader: Callable[[Path], T], what: str, output_dir: str | None = None) -> T:
    """Read the YAML ``config`` with ``loader`` (``output_dir`` overriding its own); a missing file or a bad config
    ends the command with every problem (the loader's return annotation names the config class the "did you
    mean" hints come from)."""
    if not config.is_file():
        _fail(f"the config file {config} does not exist")
    try:
        settings = loader(config)
    except (ValidationError, yaml.YAMLError) as error:
        _fail(describe(config, error, returned_model(loader)))
    except (ValueError, OSError) as error:
        _fail(f"{config} is not a valid {what} config: {str(error).splitlines()[0]}")
    return settings if output_dir is None else settings.model_copy(update={"output_dir": output_dir})


def needs_extra(what: str, extra: str, error: ImportError) -> None:
    """End the command: ``what`` needs the pip extra ``extra``, whose import failed with ``error``."""
    _fail(f"{what} needs the '{extra}' extra (pip install 'agentloop-grpc[{extra}]'): {error}")


def stop_on_sigterm() -> None:
    """A SIGTERM (a job scheduler, ``timeout``, CI) stops the run as Ctrl-C does: its servers stopped, what it
    finished kept, exit 130 (by default Python dies at once, skipping both)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def rollout(
    config: Path = typer.Option(..., "--config", "-c", help="Rollout YAML (see examples/demo.yaml)."),
    output_dir: str = typer.Option(None, help="Override the config's output_dir."),
) -> None:
    """Run agent loops over a dataset and write trajectories, the turn trace, a padded batch and a report."""
    try:
        from .progress import Progress
    except ImportError as error:
        needs_extra("the rollout display", "rollout", error)
    settings = load_settings(config, load_config, "rollout", output_dir)
    if settings.report and importlib.util.find_spec("matplotlib") is None:  # before servers start, not at the end
        _fail("the report's plots need `pip install 'agentloop-grpc[rollout]'` (module 'matplotlib' is not "
              "installed); or set report: false")
    progress = Progress()
    record = RunRecord(output_dir=Path(settings.output_dir))
    stop_on_sigterm()
    try:
        asyncio.run(run_rollout(settings, progress, record))
    except KeyboardInterrupt:
        kept = len(record.trajectories)
        typer.echo(f"interrupted: servers stopped; {kept} finished trajectories kept in {record.output_dir}", err=True)
        raise typer.Exit(130) from None
    except LoopConfigError as error:
        _fail(str(error))
    except (DatasetError, RolloutError, LaunchError, TokenizerMismatchError, RoutingUnavailableError,
            TrackerError) as error:
        _fail(str(error).splitlines()[0] if isinstance(error, DatasetError) else str(error), 1)
    progress.summary(summarize(record), str(record.output_dir), report=settings.report)
    for line in record.trackers:
        typer.echo(line)
    report_failures(record, settings.max_failed_share)


def report_failures(record: RunRecord, max_failed_share: float) -> None:
    """Print the top error causes of the failed trajectories; exit 3 when their share reached the threshold."""
    end_on_failures(sum(t.failed for t in record.trajectories), len(record.trajectories),
                    error_causes(record.trajectories), max_failed_share, record.output_dir,
                    "the Parquet `error` column has each", f"max_failed_share is {max_failed_share}")


def end_on_failures(failed: int, total: int, causes: list[tuple[str, int]], max_failed_share: float,
                    output_dir: Path, where: str, limit: str) -> None:
    """Print the top error ``causes`` of the ``failed`` trajectories of ``total`` (``where``: where each error
    is); exit 3 when their share reached ``max_failed_share`` (a run with none counts as all failed), saying
    ``limit`` (why that share ends the run)."""
    if failed:
        typer.echo(f"error causes ({failed} of {total} trajectories failed; {where}):", err=True)
        for cause, count in causes:
            typer.echo(f"  {count} x {cause}", err=True)
    share = failed / total if total else 1.0
    if share >= max_failed_share:
        _fail(f"{failed} of {total} trajectories failed ({share:.0%}), {limit}; outputs are in {output_dir}",
              EXIT_TOO_MANY_FAILED)


if __name__ == "__main__":
    typer.run(rollout)
    sys.exit(0)
