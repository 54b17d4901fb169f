"""TrainConfig: everything ``agentloop train --config FILE.yaml`` needs, with defaults and a docstring per field.

The engines, tools, dataset, loop and loops sections are the rollout's (``agentloop rollout``: one
``AgentRunConfig``, checked the same way); ``grpo`` holds the trainer's settings. Unknown fields are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentloop_grpc.common.yaml_config import load_yaml_config
from agentloop_grpc.rollout.config import AgentRunConfig, ExternalAgent

_STRICT = ConfigDict(frozen=True, extra="forbid")


class GrpoSettings(BaseModel):
    """TRL GRPOTrainer settings (the rest keep TRL's defaults)."""

    model_config = _STRICT

    max_steps: int = Field(40, ge=1, description="Optimizer steps (one rollout each).")
    prompts_per_step: int = Field(4, ge=1, description="Prompts rolled out per step.")
    num_generations: int = Field(4, ge=2, description="Trajectories per prompt: the GRPO group.")
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate (constant).")
    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 loads no reference model.")
    loss_type: str = Field("dapo", description="TRL's loss_type.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    trainable_layers: int | None = Field(
        None, ge=1, description="Train only the top N decoder layers and the final norm (the embeddings and the "
        "layers below stay frozen, and only the trained weights are pushed); None: every parameter. On a CPU the "
        "backward pass through all layers is most of a step's time.")
    seed: int = Field(0, description="Trainer seed (dataset order).")
    torch_threads: int | None = Field(None, ge=1, description="Threads of the trainer's torch (default: all cores).")


class TrainConfig(AgentRunConfig):
    """A training run: engines and tools for the rollouts, the prompts, the loops, the trainer, the outputs."""

    grpo: GrpoSettings = Field(default_factory=GrpoSettings, description="The trainer.")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: each step rolls out its prompts, then trains (engines idle while it trains). "
        "async: rollouts never stop; a step trains the oldest finished groups while the next ones roll out, each "
        "at most max_staleness weight versions behind the trainer (docs/trl.md, Fully-async).")
    max_staleness: int = Field(1, ge=0, description="async: how many versions a trained group may lag the trainer "
                               "(admission holds new groups back to keep it so; 0: no overlap).")
    agent: ExternalAgent | None = Field(
        None, description="Train an agent of your own instead of our loops (docs/gateway.md): each trajectory is a "
        "session of the session gateway served over the run's Router, and TRL trains its main chain; its reward is "
        "what the agent posts (reward: session). None: the loops.")
    check_logprobs: int = Field(4, ge=0, description="Trajectories per step whose engine logprobs are compared "
                                "with the trainer's recompute (0: none).")
    compare_steps: int = Field(5, ge=1, description="The ratio compares the mean reward of this many last steps "
                               "with as many first steps.")
    output_dir: str = Field("runs/train", description="Metrics, TRL logs, report, last trajectories, final weights.")
    save_model: bool = Field(True, description="Write the final weights (safetensors) to output_dir/final.")

    @model_validator(mode="after")
    def _agent_reward(self) -> TrainConfig:
        if self.agent is not None and self.agent.reward == "function" and self.dataset.reward is None:
            raise ValueError("agent.reward: function needs a reward function, which agentloop train does not take "
                             "(tool rewards score the loops, or the dataset's own: reasoning_gym); use reward: "
                             "session")
        if self.dataset.coding_tasks is not None and (self.agent is None or self.agent.harness is None):
            raise ValueError("dataset.coding_tasks: a coding harness plays them; set agent.harness")
        return self

    @model_validator(mode="after")
    def _sampling_is_trl_compatible(self) -> TrainConfig:
        s = self.loop.sampling
        if s.temperature == 0.0:
            raise ValueError("loop.sampling.temperature: GRPO needs sampling (> 0), not greedy decoding")
        if s.top_p < 1.0 or s.top_k != -1 or s.min_p > 0.0 or s.repetition_penalty != 1.0:
            raise ValueError("loop.sampling: top_p, top_k, min_p and repetition_penalty must stay off: the trainer's "
                             "logprobs (logits / temperature) would not describe what the engines sampled from")
        return self


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate a training YAML (ValidationError / OSError / yaml.YAMLError / ValueError on bad input)."""
    return load_yaml_config(path, TrainConfig, "a training config")
