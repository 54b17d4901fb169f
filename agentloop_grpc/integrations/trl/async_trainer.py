"""AgentLoopAsyncGRPOTrainer: TRL's AsyncGRPOTrainer on a fully-async ``AgentLoopRollout``, with or without CUDA.

```python
with AsyncAgentLoopRollout(spec, rows, max_staleness=1) as rollout:
    trainer = AgentLoopAsyncGRPOTrainer(checkpoint_dir, rollout, args=AsyncGRPOConfig(..., token_budget=0),
                                        train_dataset=prompt_dataset(rows), processing_class=tokenizer)
    trainer.train()
```

- The two seams come from the rollout (``async_worker.py``): its stream of groups is the trainer's
  ``rollout_worker``, its manager the ``weight_transfer`` (``keep=True``: pause the engines with KEEP for a push).
- Where CUDA or FlashAttention 3 is absent the constructor takes the fallbacks of ``async_fallbacks.py`` (MFU not
  computed; tree attention by SDPA) and lists them in ``fallbacks``, logged once.
- Each step leaves a ``StepRecord`` of the groups it trained in the rollout's ``history``, with the metrics
  GRPOTrainer's ``rollout_func`` path records (reward, rates, staleness, queue, idle seconds), before the
  callbacks added after construction log it; ``step_s`` and ``sync_s`` hold each step's seconds before the push
  (the wait for samples, forward, backward, optimizer) and the push's, as ``WeightSyncCallback`` does.

Its loss is TRL's: a PPO ratio to the engine's logprobs, clipped (``async_worker.py``); there is no rollout
correction to add, and no logprob check (its model runs on packed trees only; its ``ratio`` and ``kl`` logs say how
far the trainer is from the engines' sampling).
"""

from __future__ import annotations

import logging
from unittest import mock

from transformers import PreTrainedModel, TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOTrainer, async_grpo_trainer

from agentloop_grpc.agent.metrics import RolloutMetrics

from .async_fallbacks import TREE_SDPA, peak_flops_or_none, register_tree_sdpa, tree_attention
from .async_worker import AgentLoopRolloutWorker, AgentLoopWeightTransfer
from .rollout import AgentLoopRollout, StepRecord, step_metrics

log = logging.getLogger(__name__)


class AgentLoopAsyncGRPOTrainer(AsyncGRPOTrainer):
    """AsyncGRPOTrainer on ``rollout`` (see the module docstring); ``model``: the checkpoint's folder, the engines'."""

    def __init__(self, model: str, rollout: AgentLoopRollout, *, args, keep: bool = False, **kwargs) -> None:
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        if samples % args.num_generations:
            raise ValueError(f"a step's {samples} samples do not split into groups of {args.num_generations}")
        self.rollout = rollout
        self.worker = AgentLoopRolloutWorker(rollout, args.num_generations, samples // args.num_generations)
        self.transfer = AgentLoopWeightTransfer(rollout, keep=keep)
        # its constructor reads the peak FLOPs through the name it imported: swapped for the construction only
        with mock.patch.object(async_grpo_trainer, "get_peak_flops_per_device", peak_flops_or_none):
            super().__init__(model, args=args, rollout_worker=self.worker, weight_transfer=self.transfer, **kwargs)
        fallbacks = []
        if self._peak_flops_per_device is None:
            fallbacks.append("MFU not computed (peak FLOPs known for CUDA devices only)")
        attention, why = tree_attention(self.accelerator.device)
        if attention == TREE_SDPA:
            register_tree_sdpa()
            assert isinstance(self.model, PreTrainedModel)  # AsyncGRPOTrainer builds it from the checkpoint
            self.model.set_attn_implementation(TREE_SDPA)
            fallbacks.append(f"tree attention by SDPA ({why})")
        self.fallbacks = tuple(fallbacks)
        for fallback in self.fallbacks:
            log.info("AsyncGRPOTrainer: %s", fallback)
        self.step_s: dict[int, float] = {}
        self.sync_s: dict[int, float] = {}
        self._trained_version = rollout.clock.version
        self.add_callback(_StepRecords(self))

    def record_step(self, step: int, logs: dict) -> None:
        """The ``StepRecord`` of optimizer step ``step`` from the groups it trained and TRL's ``logs`` of it."""
        samples = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        trajectories = self.worker.take_groups(self.worker.trained_groups(samples))
        wait = float(logs.get("perf/rollout_wait_s") or 0.0)
        version = self._trained_version
        record = StepRecord(step, trajectories, wait)
        record.metrics = {**step_metrics(trajectories, RolloutMetrics.of(trajectories, wait), version),
                          **self.rollout.stream_metrics(trajectories, version),
                          # the trainer's own wait for samples: the stream's is its pump's, which waits meanwhile
                          "trainer_idle_s": wait}
        self.rollout.history.append(record)
        self.step_s[step] = wait + float(logs.get("perf/fwd_bwd_s") or 0.0) + float(logs.get("perf/optimizer_s") or 0.0)
        self.sync_s[step] = self.transfer.last_send_s


class _StepRecords(TrainerCallback):
    """The trainer's version as a step starts (its batches were taken at it), and the step's record when TRL logs
    it (before the callbacks added later read ``history``)."""

    def __init__(self, trainer: AgentLoopAsyncGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer._trained_version = self.trainer.rollout.clock.version

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.trainer.record_step(state.global_step, logs)
