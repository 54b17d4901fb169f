"""Trajectories -> the fields TRL's ``GRPOTrainer`` takes from a ``rollout_func``, token-exactly.

- ``prompt_ids``: the first prompt as the loop encoded it;
- ``completion_ids``: every token after it (model turns, tool turns, template separators), as recorded;
- ``logprobs``: the engine's logprob of each completion token (0.0 where the token is not the model's);
- ``env_mask``: our response mask (1 = model token), which TRL multiplies into its loss mask;
- ``agentloop_weight_versions``: the weight version that made each completion token (-1 where not the model's)
  and ``agentloop_constrained``: whether the trajectory's tool calls were grammar-constrained, so its logprobs are
  the masked distribution's (both for the rollout correction, ``corrected_trainer.py``);
- ``agentloop_routed_experts``: a MoE model's routing of the trajectory (``Routing``, input positions from 0 of
  prompt + completion), or None (not asked for, or a failed trajectory): replayed in training
  (``routing_replay.py``);
- extra fields, handed by TRL to the reward functions: ``agentloop_reward`` (our reward, computed in the rollout),
  ``agentloop_failed``, ``agentloop_infrastructure_failure`` and ``agentloop_sample_id``.

A failed trajectory (termination ERROR: a dead engine or tool server, a bad row) is no evidence about the model.
It gets reward None, which TRL (1.16) treats as unscorable: its reward is left out of its group's mean and std and
its advantage is 0; and its ``env_mask`` is all 0, so none of its tokens reach the loss even if a user's own reward
function scores it. TRL needs at least one completion token per row, so a failed trajectory's completion is one
placeholder token (masked) when it has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentloop_grpc.agent import Trajectory


def trl_fields(trajectories: Sequence[Trajectory], placeholder_id: int) -> dict[str, list[Any]]:
    """The ``rollout_func`` output for ``trajectories`` (in the order of the prompts they came from)."""
    out: dict[str, list[Any]] = {
        "prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "agentloop_weight_versions": [],
        "agentloop_constrained": [], "agentloop_routed_experts": [],
        "agentloop_reward": [], "agentloop_failed": [], "agentloop_infrastructure_failure": [],
        "agentloop_sample_id": [],
    }
    for t in trajectories:
        trained = not t.failed and bool(t.response_ids)
        out["prompt_ids"].append(list(t.prompt_ids) or [placeholder_id])
        if trained:
            out["completion_ids"].append(list(t.response_ids))
            out["logprobs"].append(list(t.response_logprobs))
            out["env_mask"].append(list(t.response_mask))
            out["agentloop_weight_versions"].append(list(t.weight_versions))
        else:
            completion = list(t.response_ids) or [placeholder_id]
            out["completion_ids"].append(completion)
            out["logprobs"].append([0.0] * len(completion))
            out["env_mask"].append([0] * len(completion))
            out["agentloop_weight_versions"].append([-1] * len(completion))
        out["agentloop_reward"].append(t.reward if trained else None)
        out["agentloop_failed"].append(t.failed)
        out["agentloop_constrained"].append(t.constrained)
        out["agentloop_routed_experts"].append(t.routed_experts if trained else None)
        out["agentloop_infrastructure_failure"].append(t.infrastructure_failure)
        out["agentloop_sample_id"].append(t.sample_id)
    return out


def agentloop_reward(completions: list, agentloop_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """A TRL reward function: the reward each trajectory earned in the rollout (None: not scorable).

    TRL names reward functions by ``__name__``, so this one logs as ``rewards/agentloop_reward/mean``.
    """
    return list(agentloop_reward)
