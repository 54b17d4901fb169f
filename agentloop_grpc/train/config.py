"""TrainConfig: everything ``agentloop train --config FILE.yaml`` needs, with defaults and a docstring per field.

The engines, tools, dataset, loop and loops sections are the rollout's (``agentloop rollout``: one
``AgentRunConfig``, checked the same way); ``grpo`` holds the trainer's settings. Unknown fields are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentloop_grpc.common.yaml_config import load_yaml_config
from agentloop_grpc.rollout.config import AgentRunConfig, ExternalAgent

if TYPE_CHECKING:
    from agentloop_grpc.integrations.trl.correction import RolloutCorrection

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


class CorrectionSettings(BaseModel):
    """Rollout correction: importance weights from the engine's logprobs (the behaviour policy) against the
    trainer's recompute, on model tokens (docs/trl.md, Rollout correction)."""

    model_config = _STRICT

    enabled: bool | None = Field(
        None, description="Weight each model token's loss by trainer / engine probability. None: on in mode: async "
        "(tokens there are up to max_staleness versions old), off in mode: sync (every token is the trainer's own "
        "version, so the weights are 1 up to numerics, for one more forward pass a step).")
    mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "decoupled"] = Field(
        "token_truncate", description="token_*: one weight per token; sequence_*: one per trajectory (the product "
        "over its tokens); *_truncate clamps the weight to [low, high], *_mask sets it to 0 outside; decoupled: "
        "AReaL's decoupled PPO objective (the weight masked above high, no low).")
    low: float | None = Field(None, ge=0, description="Lower bound of the weight (None: none).")
    high: float | None = Field(2.0, gt=0, description="Upper bound of the weight (None: none; decoupled needs it).")
    constrained: Literal["exclude", "include"] = Field(
        "exclude", description="Trajectories whose tool calls were grammar-constrained: the engine's logprobs are the "
        "masked distribution's, higher than the policy's by the mass the grammar removed. exclude: their tokens keep "
        "weight 1 (uncorrected); include: weighted anyway, biased down by that mass.")

    def resolved(self, mode: str) -> RolloutCorrection | None:
        """The ``RolloutCorrection`` of a run in ``mode`` (sync or async), or None when off."""
        from agentloop_grpc.integrations.trl.correction import RolloutCorrection

        if not (self.enabled if self.enabled is not None else mode == "async"):
            return None
        return RolloutCorrection(self.mode, self.low, self.high, self.constrained)


class TrainConfig(AgentRunConfig):
    """A training run: engines and tools for the rollouts, the prompts, the loops, the trainer, the outputs."""

    grpo: GrpoSettings = Field(default_factory=GrpoSettings, description="The trainer.")
    trainer: Literal["trl", "trl_async"] = Field(
        "trl", description="trl: TRL's GRPOTrainer (sync or async mode, with the rollout correction). trl_async: "
        "TRL's AsyncGRPOTrainer (implies mode: async; its own loss clips its ratio to the engine's logprobs, so "
        "no correction, beta 0 and loss_type dapo; on a CPU it trains with SDPA tree attention and no MFU "
        "metric: docs/trl.md).")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: each step rolls out its prompts, then trains (engines idle while it trains). "
        "async: rollouts never stop; a step trains the oldest finished groups while the next ones roll out, each "
        "at most max_staleness weight versions behind the trainer (docs/trl.md, Fully-async).")
    max_staleness: int = Field(1, ge=0, description="async: how many versions a trained group may lag the trainer "
                               "(admission holds new groups back to keep it so; 0: no overlap).")
    correction: CorrectionSettings = Field(default_factory=CorrectionSettings,
                                           description="Rollout correction (importance weights on stale tokens).")
    agent: ExternalAgent | None = Field(
        None, description="Train an agent of your own instead of our loops (docs/gateway.md): each trajectory is a "
        "session of the session gateway served over the run's Router, and TRL trains its main chain; its reward is "
        "what the agent posts (reward: session). None: the loops.")
    check_logprobs: int = Field(4, ge=0, description="Trajectories per step whose engine logprobs are compared "
                                "with the trainer's recompute (0: none).")
    routing_replay: bool = Field(
        True, description="A MoE model (Qwen3-MoE): the rollouts record the experts each token was routed to and "
        "the trainer's forward routes those tokens to them (R3, docs/trl.md); ignored for a dense model, an error "
        "for a MoE architecture it does not know. false: the trainer routes with its own router.")
    compare_steps: int = Field(5, ge=1, description="The ratio compares the mean reward of this many last steps "
                               "with as many first steps.")
    output_dir: str = Field("runs/train", description="Metrics, TRL logs, report, last trajectories, final weights.")
    save_model: bool = Field(True, description="Write the final weights (safetensors) to output_dir/final.")

    @model_validator(mode="before")
    @classmethod
    def _trl_async_is_async(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("trainer") == "trl_async":
            if data.get("mode", "async") != "async":
                raise ValueError("trainer: trl_async trains fully-async: leave mode out or set mode: async")
            data = {**data, "mode": "async"}
        return data

    @model_validator(mode="after")
    def _trl_async_options(self) -> TrainConfig:
        if self.trainer != "trl_async":
            return self
        refused = {
            "grpo.beta": (self.grpo.beta != 0.0, "AsyncGRPOTrainer has no reference model (set 0)"),
            "grpo.loss_type": (self.grpo.loss_type != "dapo", "AsyncGRPOTrainer's loss is its own, normalized "
                               "by tokens as dapo (leave it out)"),
            "correction.enabled": (self.correction.enabled is True, "AsyncGRPOTrainer's loss already clips its "
                                   "ratio to the engine's logprobs; the rollout correction is trainer: trl's"),
            "loop.constrain_tool_calls": (self.loop.constrain_tool_calls, "AsyncGRPOTrainer reads the engine's "
                                          "logprobs as the policy's, and under the call grammar they are the "
                                          "masked distribution's (set false)"),
            "max_staleness: 0": (self.max_staleness < 1, "AsyncGRPOTrainer asks for a micro-batch of its next "
                                 "step before it steps, and 0 admits no group for it until then: it would wait "
                                 "forever (set 1 or more)"),
        }
        for name, (bad, why) in refused.items():
            if bad:
                raise ValueError(f"{name} is not for trainer: trl_async: {why}")
        return self

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
    def _correction_is_valid(self) -> TrainConfig:
        try:
            self.correction.resolved("async")
        except ValueError as exc:
            raise ValueError(f"correction: {exc}") from None
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
