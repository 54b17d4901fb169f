"""Our trajectories as the DataProto verl's trainer reads from an agent-loop rollout (what verl's agent-loop
manager's ``_postprocess`` returns), built on ``agent.to_batch``'s tensors.

Tensors: ``prompts`` (left-padded), ``responses`` (right-padded), ``response_mask`` (1 on model tokens only),
``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs`` (the engine's) and ``rm_scores`` (the
trajectory's reward on its last response token, where verl's loops put it). Non-tensor: ``uid`` (the GRPO group),
``__num_turns__`` (verl counts user and assistant turns plus the prompt), ``turn_scores``, ``tool_rewards``,
``min_global_steps``/``max_global_steps`` (the weight versions of the model tokens), ``extras``, ``sample_id``.
meta_info: ``metrics`` (per trajectory: seconds generating and in tools, failovers as ``num_preempted``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto

from agentloop_grpc.agent.batch import to_batch
from agentloop_grpc.agent.trajectory import Trajectory

#: The tensors verl's trainer reads from an agent-loop batch (``rm_scores`` when rewards were computed).
TENSORS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
           "rollout_log_probs", "rm_scores")


def _objects(values: Sequence) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def to_dataproto(trajectories: Sequence[Trajectory], pad_token_id: int, prompt_length: int | None = None,
                 response_length: int | None = None) -> DataProto:
    """Failed trajectories are left out (never trained on: ``to_batch``)."""
    batch = to_batch(trajectories, pad_token_id, prompt_length, response_length)
    kept = {t.sample_id: t for t in trajectories}
    rows = [kept[sample_id] for sample_id in batch.sample_ids]
    tensors = dict(batch.tensors)
    p = tensors["prompts"].size(1)
    last = (tensors["attention_mask"][:, p:].sum(dim=1) - 1).clamp(min=0)
    rm_scores = torch.zeros_like(tensors["response_mask"], dtype=torch.float32)
    rm_scores[torch.arange(len(rows)), last] = tensors["rewards"]
    tensors["rm_scores"] = rm_scores
    versions = [[v for v, m in zip(t.weight_versions, t.response_mask) if m] or [0] for t in rows]
    non_tensor = {
        "uid": _objects([t.group_id or t.sample_id for t in rows]),
        "sample_id": _objects([t.sample_id for t in rows]),
        "__num_turns__": np.array([t.user_turns + t.assistant_turns + 1 for t in rows], dtype=np.int32),
        "turn_scores": _objects([list(t.turn_scores) for t in rows]),
        "tool_rewards": _objects([list(t.tool_rewards) for t in rows]),
        "min_global_steps": _objects([min(v) for v in versions]),
        "max_global_steps": _objects([max(v) for v in versions]),
        "extras": _objects([{"termination": t.termination.value, "tool_calls": t.tool_calls} for t in rows]),
    }
    metrics = [{"generate_sequences": t.timings.generate_s, "tool_calls": t.timings.tools_s,
                "num_preempted": t.resumed_generations} for t in rows]
    return DataProto(
        batch=TensorDict({name: tensors[name] for name in TENSORS}, batch_size=len(rows)),
        non_tensor_batch=non_tensor,
        meta_info={"metrics": metrics},
    )
