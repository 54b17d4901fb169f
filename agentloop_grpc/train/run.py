"""One training run, start to finish: GRPO with TRL on rollouts from our engine and tool servers.

Steps: (1) the dataset's rows, read and checked by the caller (``preflight.checked_rows``) before anything starts;
(2) start the engine replicas and the tool server (or use running ones) on a background loop; (3) the
rollout (``AgentLoopRollout``: one manager for the whole run, tokenizer checked against the engines) and TRL's
GRPOTrainer on the engines' own checkpoint, with the weight push after every step; (4) every step: one line of
progress and one JSON line of metrics (reward, correct and valid-call rates, rollout / train / weight-sync
seconds, engine-vs-trainer logprob differences, TRL's loss and grad norm), and the trackers of report_to (TRL's
own integrations) get TRL's logs with our rollout metrics added; (5) outputs: metrics.jsonl and .csv, TRL's log
history, the last rollout's trajectories, the final weights, summary.json and report.html. Servers this run
started are stopped on the way out.
"""

from __future__ import annotations

import asyncio
import csv
import json
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from transformers import TrainerCallback
from transformers.integrations import INTEGRATION_TO_CALLBACK
from transformers.trainer_callback import PrinterCallback

from agentloop_grpc.agent import WorkerSpec, write_parquet
from agentloop_grpc.integrations.background_loop import BackgroundLoop
from agentloop_grpc.integrations.trl import (
    AgentLoopRollout,
    AsyncAgentLoopRollout,
    WeightSyncCallback,
    agentloop_reward,
    prompt_dataset,
    train_top_layers,
)
from agentloop_grpc.rollout.run import RolloutError, engine_source, error_causes, routing, start_engines, start_tools
from agentloop_grpc.trackers import resolve_report_to
from agentloop_grpc.trackers.rollout import sample_rows
from agentloop_grpc.trackers.trainer_env import scoped_environ, trainer_environ
from agentloop_grpc.trackers.trainer_samples import TrainerSampleTables

from .config import TrainConfig
from .progress import progress_line
from .record import TrainRecord

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

RATIO_NAME = "train_reward_last_over_first"
#: Rollout metrics TRL logs itself (as reward and frac_reward_zero_std): left out of its logs, not logged twice.
_LOGGED_BY_TRL = frozenset({"reward_mean", "frac_groups_zero_std"})

First = TypeVar("First")
Second = TypeVar("Second")


class StepTimes(Protocol):
    """Each optimizer step's seconds before the weight push (``step_s``) and of the push (``sync_s``), by step:
    ``WeightSyncCallback`` (GRPOTrainer) or ``AgentLoopAsyncGRPOTrainer``."""

    step_s: dict[int, float]
    sync_s: dict[int, float]


class StepLog(TrainerCallback):
    """One metrics record per optimizer step: the rollout's, the weight push's and TRL's own logs. It also adds
    the rollout's metrics to TRL's logs (as ``agentloop/NAME``), so the trackers that follow it log them."""

    def __init__(self, rollout: AgentLoopRollout, sync: StepTimes, record: TrainRecord,
                 echo: Callable[[str], None]) -> None:
        self.rollout, self.sync, self.record, self.echo = rollout, sync, record, echo
        self._path = record.output_dir / "metrics.jsonl"
        self._path.unlink(missing_ok=True)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        step = state.global_step
        if not logs or "loss" not in logs or not self.rollout.history:
            return  # the closing summary log, or a log before any step
        rollout = self.rollout.history[-1]
        step_s = self.sync.step_s.get(step, 0.0)
        train_s = round(max(step_s - rollout.rollout_s, 0.0), 3)
        weight_sync_s = round(self.sync.sync_s.get(step, 0.0), 3)
        entry = {
            "step": step,
            **{k: _significant(v) for k, v in rollout.metrics.items()},
            "train_s": train_s,
            "weight_sync_s": weight_sync_s,
            "loss": logs.get("loss"),
            "grad_norm": logs.get("grad_norm"),
            "trl_reward": logs.get("reward"),
            "trl_frac_reward_zero_std": logs.get("frac_reward_zero_std"),
            "entropy": logs.get("entropy"),
            "completion_mean_length": logs.get("completions/mean_length"),
            # the rollout correction's weights (CorrectedGRPOTrainer logs them to TRL's logs)
            **{k: _significant(v) for k, v in logs.items() if k.startswith(("correction/", "routing_replay/"))},
        }
        if logs.get("ratio") is not None:  # AsyncGRPOTrainer: its PPO ratio to the engine's logprobs, before the clip
            entry.update(policy_ratio_mean=_significant(logs["ratio"]), policy_kl=_significant(logs["kl"]))
        # sync: the trainer waits out the rollout, the engines the training and the push (async measures both)
        entry.setdefault("trainer_idle_s", entry["rollout_s"])
        entry.setdefault("engine_idle_s", round(train_s + weight_sync_s, 3))
        self.record.steps.append(entry)
        logs.update(rollout_log_metrics(entry, rollout.metrics))
        with self._path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        self.echo(progress_line(step, args.max_steps, entry, self.rollout.check_logprobs > 0))


def rollout_log_metrics(entry: dict, rollout_keys: Iterable[str]) -> dict[str, float]:
    """What TRL's logs lack, as ``agentloop/NAME``: the step's rollout metrics (``rollout_keys`` of ``entry``, but
    those TRL logs itself) and the train seconds."""
    keys = [key for key in rollout_keys if key not in _LOGGED_BY_TRL] + ["train_s"]
    return {f"agentloop/{key}": entry[key] for key in keys}


def trackers_last(trainer: Trainer) -> None:
    """Move the Trainer's tracker callbacks after ours: callbacks run in order, so they see the metrics ours add
    to the logs (the Trainer puts them first)."""
    for callback in [c for c in trainer.callback_handler.callbacks if type(c) in INTEGRATION_TO_CALLBACK.values()]:
        trainer.remove_callback(callback)
        trainer.add_callback(callback)


def _significant(value: float) -> float:
    """Four significant digits: logprob differences of 1e-6 must not round to 0."""
    return float(f"{value:.4g}")


async def _gather(first: Awaitable[First], second: Awaitable[Second]) -> tuple[First, Second]:
    return await asyncio.gather(first, second)


def _window(steps: list[dict], compare_steps: int) -> int:
    """How many first and last steps the ratio compares: ``compare_steps``, at most half the run."""
    return max(1, min(compare_steps, len(steps) // 2))


def reward_ratio(steps: list[dict], compare_steps: int) -> tuple[float, float, float]:
    """(mean reward of the first k steps, of the last k steps, last / first); k is halved for short runs."""
    k = _window(steps, compare_steps)
    first = statistics.fmean(s["reward_mean"] for s in steps[:k])
    last = statistics.fmean(s["reward_mean"] for s in steps[-k:])
    return first, last, (last / first if first > 0 else float("inf") if last > 0 else 1.0)


def worker_spec(config: TrainConfig, addresses: Sequence[str], model_dir: str | None,
                tool_address: str | None) -> WorkerSpec:
    """What the rollout's workers are built from: the run's engines, tools and loops, and the reward its dataset
    brings (reasoning_gym: the task's scorer; otherwise the tool rewards)."""
    # engines from a discovery file are followed: a server the launcher restarts elsewhere joins the run
    engines, discovery_file = engine_source(config.engines, addresses, Path(config.output_dir))
    return WorkerSpec(engines=engines, discovery_file=discovery_file, tool_server=tool_address,
                      tool_security=config.tools.security,
                      model_dir=model_dir, reward=config.dataset.reward, loop=config.loop, loops=config.loops,
                      router=routing(config))


def run_training(config: TrainConfig, rows: list[dict], echo: Callable[[str], None] = print) -> TrainRecord:
    """Train on ``rows`` (the dataset's, as ``preflight.checked_rows`` gave them)."""
    import torch

    from agentloop_grpc.common import model_store
    from agentloop_grpc.integrations.trl.async_worker import StreamStarved

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = TrainRecord(out)
    report_to = resolve_report_to(config.report_to)
    servers = BackgroundLoop("agentloop-servers")
    stack = AsyncExitStack()
    started = time.monotonic()
    try:
        # 2. engines and tools
        echo("starting engine and tool servers")
        (addresses, model_dir), tool_address = servers.run(_gather(start_engines(config.engines, stack, out),
                                                                    start_tools(config.tools, stack, out)))
        # 3. the rollout and the trainer, on the engines' checkpoint
        checkpoint = model_store.resolve(model_dir)
        config = with_routing_replay(config, checkpoint)
        spec = worker_spec(config, addresses, model_dir, tool_address)
        if config.grpo.torch_threads:
            torch.set_num_threads(config.grpo.torch_threads)
        trl_async = config.trainer == "trl_async"
        options = {"max_staleness": config.max_staleness, "seed": config.grpo.seed} if config.mode == "async" else {}
        with (AsyncAgentLoopRollout if config.mode == "async" else AgentLoopRollout)(
                spec, rows, num_workers=config.workers, default_loop=config.dataset.default_loop,
                ground_truth_kwargs=config.dataset.ground_truth_kwargs,
                # AsyncGRPOTrainer's model runs on packed trees only: its ratio and kl logs stand for the check
                check_logprobs=0 if trl_async else config.check_logprobs,
                ready_timeout_s=config.engines.launch.startup_timeout_s if config.engines.launch else 300.0,
                agent=config.agent, **options) as rollout:
            g = config.grpo
            # the Trainer's tracker callbacks read their settings from the environment, at init and at train begin
            with scoped_environ(trainer_environ(report_to, config.trackers, out)):
                if trl_async:
                    trainer, times = _async_trainer(config, rollout, checkpoint, rows, report_to, echo)
                else:
                    trainer, times = _grpo_trainer(config, rollout, checkpoint, rows, report_to)
                tokenizer = trainer.processing_class
                trainer.remove_callback(PrinterCallback)  # its raw log dicts would drown the one line per step
                trainer.add_callback(StepLog(rollout, times, record, echo))
                if report_to and config.trackers.samples:
                    trainer.add_callback(TrainerSampleTables(
                        report_to, config.trackers.tensorboard_dir(out),
                        lambda: sample_rows(rollout.history[-1].trajectories if rollout.history else [],
                                            lambda ids: tokenizer.decode(list(ids)), config.trackers.samples)))
                trackers_last(trainer)
                echo(f"training{' with AsyncGRPOTrainer' if trl_async else ''}: {g.max_steps} steps of "
                     f"{g.prompts_per_step} prompts x {g.num_generations} "
                     f"trajectories on {len(addresses)} engine replica(s)" +
                     (f", logging to {', '.join(report_to)}" if report_to else ""))
                try:
                    trainer.train()
                except StreamStarved as starved:  # AsyncGRPOTrainer's stream can never give the step a sample
                    if not starved.every_trajectory_failed:
                        raise RolloutError(f"AsyncGRPOTrainer stopped: {starved}") from starved
                    echo(f"AsyncGRPOTrainer stopped before its first step: {starved}")
                    record.untrained = starved.trajectories
            versions = rollout.engine_versions()
            transfer = rollout.manager.weight_transfer
            echo(f"weights reached the engines by {transfer} (the fastest transfer that worked here)")
            # 5. outputs
            (out / "trl_log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1) + "\n")
            if rollout.history:
                write_parquet(list(rollout.history[-1].trajectories), out / "trajectories.parquet")
            record.error_causes = error_causes([t for step in rollout.history for t in step.trajectories]
                                               + list(record.untrained))
            if config.save_model:
                trainer.save_model(str(out / "final"))
                tokenizer.save_pretrained(str(out / "final"))
    finally:
        servers.run(stack.aclose())
        servers.close()
    write_csv(record.steps, out / "metrics.csv")
    first, last, ratio = reward_ratio(record.steps, config.compare_steps) if record.steps else (0.0, 0.0, 1.0)
    correction = None if config.trainer == "trl_async" else config.correction.resolved(config.mode)
    record.summary = {"mode": config.mode, "trainer": config.trainer,
                      "correction": ("the trainer's clipped ratio" if config.trainer == "trl_async"
                                     else correction.mode if correction else "off"),
                      **summarize(record.steps, first, last, ratio, versions, time.monotonic() - started,
                                  config.compare_steps, transfer)}
    (out / "summary.json").write_text(json.dumps(record.summary, indent=2) + "\n")
    from .report import write_report

    write_report(record, out / "report.html")
    return record


def _training_args(config: TrainConfig, report_to: Sequence[str]) -> dict[str, Any]:
    """The Trainer settings both trainers take: one rollout of prompts_per_step groups per optimizer step, trained
    in micro-batches of one group, on the CPU."""
    g, out = config.grpo, Path(config.output_dir)
    return {
        "output_dir": str(out / "trl"),
        "per_device_train_batch_size": g.num_generations,
        "num_generations": g.num_generations,
        "gradient_accumulation_steps": g.prompts_per_step,
        "max_steps": g.max_steps,
        "learning_rate": g.learning_rate,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_grad_norm": g.max_grad_norm,
        "temperature": config.loop.sampling.temperature,
        "seed": g.seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": list(report_to) or "none",
        "run_name": config.trackers.name_of_run(out),
        "use_cpu": True,
        "bf16": False,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": False,  # a 135M model fits; recomputing activations doubled the backward
    }


def _grpo_trainer(config: TrainConfig, rollout: AgentLoopRollout, checkpoint: Path, rows: list[dict],
                  report_to: Sequence[str]) -> tuple[Any, StepTimes]:
    """TRL's GRPOTrainer (with the rollout correction) on ``rollout``, the weights pushed after every step."""
    from trl import GRPOConfig

    from agentloop_grpc.common import model_store
    from agentloop_grpc.integrations.trl.corrected_trainer import CorrectedGRPOTrainer

    model, tokenizer = model_store.load(checkpoint)
    train_top_layers(model, config.grpo.trainable_layers)
    model.train()
    sync = WeightSyncCallback(rollout)
    args = GRPOConfig(**_training_args(config, report_to), beta=config.grpo.beta, loss_type=config.grpo.loss_type)
    trainer = CorrectedGRPOTrainer(
        model=model,
        reward_funcs=[agentloop_reward],
        args=args,
        train_dataset=prompt_dataset(rows),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[sync],
        correction=config.correction.resolved(config.mode),
        version_of=rollout.clock.version_of,
        routing_replay=config.routing_replay,
    )
    return trainer, sync


def with_routing_replay(config: TrainConfig, checkpoint: Path) -> TrainConfig:
    """``config`` with its loops asking the engines for routed experts when the trainer replays them (a MoE
    checkpoint, ``routing_replay`` on), read from the checkpoint's config before anything loads."""
    from transformers import AutoConfig

    from agentloop_grpc.integrations.trl.routing_replay import replays

    if not config.routing_replay or not replays(AutoConfig.from_pretrained(checkpoint, local_files_only=True)):
        return config
    if config.trainer == "trl_async":
        raise ValueError("routing_replay: AsyncGRPOTrainer's forward does not replay routing; use trainer: trl, or "
                         "set routing_replay: false to train this MoE model with its own routing")
    return config.model_copy(update={"loop": config.loop.model_copy(update={"return_routed_experts": True})})


def _async_trainer(config: TrainConfig, rollout: AgentLoopRollout, checkpoint: Path, rows: list[dict],
                   report_to: Sequence[str], echo: Callable[[str], None]) -> tuple[Any, StepTimes]:
    """TRL's AsyncGRPOTrainer on ``rollout``'s stream (``trainer: trl_async``), its CUDA parts replaced where absent."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from agentloop_grpc.common import model_store
    from agentloop_grpc.integrations.trl.async_trainer import AgentLoopAsyncGRPOTrainer

    # token_budget 0: fixed micro-batches of one group (a budget would be asked of a vLLM server)
    args = AsyncGRPOConfig(**_training_args(config, report_to), max_staleness=config.max_staleness, token_budget=0)
    trainer = AgentLoopAsyncGRPOTrainer(str(checkpoint), rollout, args=args, train_dataset=prompt_dataset(rows),
                                        processing_class=model_store.load_tokenizer(checkpoint))
    train_top_layers(trainer.model, config.grpo.trainable_layers)
    for fallback in trainer.fallbacks:
        echo(f"AsyncGRPOTrainer: {fallback}")
    if config.check_logprobs:
        echo("AsyncGRPOTrainer: no engine-vs-trainer logprob check (|dlogp| off); its ratio to the engine's "
             "logprobs is in the line")
    return trainer, trainer


def summarize(steps: list[dict], first: float, last: float, ratio: float, versions: dict[str, int],
              wall_s: float, compare_steps: int, weight_transfer: str) -> dict:
    def mean(key: str) -> float:
        values = [s[key] for s in steps if s.get(key) is not None]
        return _significant(statistics.fmean(values)) if values else 0.0

    def most(key: str) -> float:
        values = [s[key] for s in steps if s.get(key) is not None]
        return max(values) if values else 0.0

    return {
        "steps": len(steps),
        "wall_s": round(wall_s, 1),
        "reward_first_steps": round(first, 4),
        "reward_last_steps": round(last, 4),
        RATIO_NAME: round(ratio, 3) if ratio != float("inf") else "inf",
        "compare_steps": _window(steps, compare_steps),
        "mean_rollout_s": mean("rollout_s"),
        "mean_train_s": mean("train_s"),
        "mean_weight_sync_s": mean("weight_sync_s"),
        "mean_trainer_idle_s": mean("trainer_idle_s"),
        "mean_engine_idle_s": mean("engine_idle_s"),
        "staleness_max": most("staleness_max"),
        "dropped_stale": sum(s.get("dropped_stale", 0) for s in steps),
        "weight_transfer": weight_transfer,
        "logprob_diff_sampler_mean": mean("logprob_diff_sampler_mean"),
        "logprob_diff_sampler_max": most("logprob_diff_sampler_max"),
        "logprob_diff_policy_mean": mean("logprob_diff_policy_mean"),
        "logprob_diff_policy_max": most("logprob_diff_policy_max"),
        "stale_tokens": sum(s.get("stale_tokens", 0) for s in steps),
        "correction_ratio_mean": mean("correction/ratio_mean"),
        "correction_ratio_max": most("correction/ratio_max"),
        "infrastructure_failures": sum(s.get("infrastructure_failures", 0) for s in steps),
        "infrastructure_causes": _causes(steps),
        "engine_weight_versions": versions,
    }


def _causes(steps: list[dict]) -> dict[str, int]:
    """The run's infrastructure failures by cause, from each step's ``infrastructure_failures/<cause>``."""
    prefix = "infrastructure_failures/"
    counts: Counter[str] = Counter()
    for step in steps:
        for key, value in step.items():
            if key.startswith(prefix):
                counts[key[len(prefix):]] += int(value)
    return dict(counts.most_common())


def write_csv(steps: list[dict], path: Path) -> None:
    if not steps:
        return
    columns = list(dict.fromkeys(key for step in steps for key in step))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(steps)
