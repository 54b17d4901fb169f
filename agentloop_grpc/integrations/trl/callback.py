"""WeightSyncCallback: after every optimizer step, the engines get the trainer's weights, versioned by the step.

TRL's GRPOTrainer syncs weights itself only into its own vLLM; with a ``rollout_func`` on our engines this callback
does it: ``on_step_end`` pushes every parameter with ``weight_version = global_step`` (Pause ABORT, UpdateWeights,
Resume on every engine; ``AgentLoopRollout.base_version`` added when the engines had updates before this run),
so each token of the next rollout records the weights that produced it, and logs how
long the push took (``weight_sync_s``) into the trainer's logs.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class WeightSyncCallback(TrainerCallback):
    def __init__(self, rollout) -> None:
        self.rollout = rollout
        self.sync_s: dict[int, float] = {}
        self.step_s: dict[int, float] = {}
        self._step_started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.monotonic()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # the step's wall time before the push: rollout, scoring, forward, backward and the optimizer
        self.step_s[state.global_step] = time.monotonic() - self._step_started
        self.sync_s[state.global_step] = self.rollout.push_weights(model, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and state.global_step in self.sync_s:
            logs["weight_sync_s"] = round(self.sync_s[state.global_step], 3)
