"""``agentloop train --config FILE``: GRPO with TRL on our rollouts; bad input ends with one clear sentence and a
non-zero exit before any server starts; the last line is the run's ratio (``RATIO train_reward_last_over_first``).

Exit codes as ``agentloop rollout``'s: 0 done; 1 the run could not start or go on; 2 bad command line or config; 3
every trajectory of the run failed (outputs written, the top error causes printed, no ratio); 130 interrupted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from agentloop_grpc.launch.launcher import LaunchError
from agentloop_grpc.rollout.command import _fail, end_on_failures, load_settings, needs_extra, stop_on_sigterm
from agentloop_grpc.rollout.dataset import DatasetError
from agentloop_grpc.rollout.run import LoopConfigError, RolloutError

from .config import load_train_config
from .preflight import checked_rows

#: What the ratio should reach: the policy's reward at the end at least 1.5 times its reward at the start.
RATIO_TARGET = 1.5


def train(
    config: Path = typer.Option(..., "--config", "-c", help="Training YAML (see examples/train.yaml)."),
    output_dir: str = typer.Option(None, help="Override the config's output_dir."),
    max_steps: int = typer.Option(None, help="Override grpo.max_steps."),
) -> None:
    """Train the engines' model with TRL's GRPOTrainer on agent-loop rollouts; write metrics and a report."""
    # TRL warns once per import about the experimental rollout_func, whose version is pinned and tested here
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    settings = load_settings(config, load_train_config, "training", output_dir)
    if max_steps is not None:
        settings = settings.model_copy(update={"grpo": settings.grpo.model_copy(update={"max_steps": max_steps})})
    # a row or loop that cannot run is told before the trainer's imports, which take seconds
    try:
        rows = checked_rows(settings)
    except LoopConfigError as error:
        _fail(str(error))
    except DatasetError as error:
        _fail(str(error).splitlines()[0], 1)
    # TRL's trainer modules import vLLM whenever the package is installed (``is_vllm_available()`` is a
    # ``find_spec("vllm")``; GRPOTrainer's module imports its vLLM generation path unconditionally), which costs
    # seconds and memory in every run; this process never generates with vLLM (the engines are other processes,
    # reached over gRPC), so it tells the import system vllm is absent here, before TRL is imported. Only this
    # process: engines it launches import what they need.
    sys.modules.setdefault("vllm", None)  # type: ignore[arg-type]  # None is "absent" to imports; typeshed omits it
    try:
        from .run import RATIO_NAME, run_training
    except ImportError as error:
        needs_extra("training", "trl", error)
    stop_on_sigterm()
    try:
        record = run_training(settings, rows, echo=typer.echo)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: servers stopped; per-step metrics so far in {settings.output_dir}", err=True)
        raise typer.Exit(130) from None
    except LoopConfigError as error:
        _fail(str(error))
    except (DatasetError, LaunchError, RolloutError) as error:
        _fail(str(error).splitlines()[0], 1)
    s = record.summary
    typer.echo(
        f"done: {s['steps']} steps in {s['wall_s']:.0f} s; mean reward {s['reward_first_steps']:.3f} (first "
        f"{s['compare_steps']} steps) -> {s['reward_last_steps']:.3f} (last {s['compare_steps']}); step time: "
        f"rollout {s['mean_rollout_s']:.1f} s, train {s['mean_train_s']:.1f} s, weight sync "
        f"{s['mean_weight_sync_s']:.1f} s; report: {record.output_dir / 'report.html'}"
    )
    # a run whose every trajectory failed learned nothing: it ends as a failed rollout does, with no ratio
    # a trl_async run stopped before its first step has no per-step metrics to point to
    where = ("causes from every trajectory rolled out; no step ran" if record.untrained else
             "causes from the last rollouts kept, metrics.jsonl has each step's failures")
    end_on_failures(*record.failed_and_all, record.error_causes, 1.0, record.output_dir, where,
                    "so the policy had nothing to learn from")
    typer.echo(f"RATIO {RATIO_NAME} {s[RATIO_NAME]} target {RATIO_TARGET}")
