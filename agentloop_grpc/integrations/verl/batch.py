"""Our trajectories as the DataProto verl's trainer reads from an agent-loop rollout (what verl's agent-loop
manager's ``_postprocess`` returns), built on ``agent.to_batch``'s tensors.

Tensors: ``prompts`` (left-padded), ``responses`` (right-padded), ``response_mask`` (1 on model tokens only),
``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs`` (the engine's) and ``rm_scores`` (the
trajectory's reward on its last response token, where verl's loops put it), and ``routed_experts`` when the
trajectories carry a MoE model's routing (the loop's ``return_routed_experts``, which the manager sets from verl's
``rollout.enable_rollout_routing_replay``): verl's R3 layout, what its own agent loop builds, int16 ``[B, P + R, MoE
layers, top-k]`` beside ``input_ids`` with 0 where unknown (padding, the last position), which its router replay
(``actor.router_replay.mode: R3``) unpads with ``input_ids``; our layers are the MoE layers only, numbered as the
contract does, which verl's Megatron replay reads by MoE-layer ordinal. Non-tensor: the input batch's columns as
they came (``columns``: verl's trainer unions the output with its batch, which needs them equal), ``uid`` (the
input's when given, else each trajectory's GRPO group), ``__num_turns__`` (verl counts the prompt, each assistant
turn and each tool or user turn), ``multi_modal_inputs`` (per row, what the model's processor makes of the row's
pictures minus the ids: each picture's outputs concatenated on dim 0 per key, the dimension verl's trainer
concatenates rows on, so rows with different numbers of pictures still concatenate; ``{}`` for rows without
pictures), ``tool_call_counts``, ``turn_scores``, ``tool_rewards``, ``min_global_steps``/``max_global_steps`` (the
weight versions of the model tokens), ``extras``, ``sample_id``, and one column per reward extra-info key.
meta_info: ``metrics`` (per trajectory: seconds generating, in tools and scoring, failovers as ``num_preempted``)
and ``reward_extra_keys``.

Every trajectory must have succeeded (``FailedTrajectoriesError`` names those that did not): verl's batch keeps one
row per input row, and a failed row kept with a zero mask would still enter its GRPO group's mean and std with a
reward it never earned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto

from agentloop_grpc.agent.batch import to_batch
from agentloop_grpc.agent.trajectory import Trajectory
from agentloop_grpc.common.media import ImageExpander, decode_image

#: The tensors verl's trainer reads from an agent-loop batch (``rm_scores`` when rewards were computed).
TENSORS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
           "rollout_log_probs", "rm_scores")


class FailedTrajectoriesError(RuntimeError):
    """Some trajectories failed; ``failures`` holds (sample id, error) of each."""

    def __init__(self, failures: Sequence[tuple[str, str]], total: int) -> None:
        self.failures = tuple(failures)
        listed = "; ".join(f"{sample_id}: {error}" for sample_id, error in self.failures[:8])
        more = f" (and {len(self.failures) - 8} more)" if len(self.failures) > 8 else ""
        super().__init__(f"{len(self.failures)} of {total} trajectories failed, and verl's batch needs one row per "
                         f"input row: {listed}{more}")


def _objects(values: Sequence) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def num_turns(trajectory: Trajectory) -> int:
    """verl's count: the prompt, every assistant turn, every user turn and every turn of tool responses."""
    messages = trajectory.messages
    tool_turns = sum(1 for i in range(1, len(messages)) if messages[i].get("role") == "tool"
                     and messages[i - 1].get("role") == "assistant" and messages[i - 1].get("tool_calls"))
    return 1 + trajectory.assistant_turns + trajectory.user_turns + tool_turns


def multi_modal_inputs(trajectory: Trajectory, images: ImageExpander | None) -> dict[str, torch.Tensor]:
    """The processor's tensors for ``trajectory``'s pictures, as verl's trainer reads them from one row."""
    if not trajectory.media:
        return {}
    if images is None:
        raise ValueError(f"trajectory {trajectory.sample_id} has {len(trajectory.media)} images: pass the model's "
                         "image processor (images=ImageExpander.load(model path))")
    per_key: dict[str, list[torch.Tensor]] = {}
    for i, item in enumerate(trajectory.media):
        expansion = images.expand(decode_image(item.data, item.mime_type))
        if len(expansion.ids) != item.length:  # another processor than the rollout's would feed the wrong features
            raise ValueError(f"trajectory {trajectory.sample_id}: the processor expands media[{i}] to "
                             f"{len(expansion.ids)} ids, the trajectory's span has {item.length}")
        for key, value in expansion.inputs.items():
            per_key.setdefault(key, []).append(torch.as_tensor(np.asarray(value)))
    return {key: torch.cat(values, dim=0) for key, values in per_key.items()}


def _reward_columns(reward_extra: Sequence[Mapping[str, Any]], rows: int) -> dict[str, np.ndarray]:
    if len(reward_extra) != rows:
        raise ValueError(f"reward_extra has {len(reward_extra)} entries for {rows} trajectories")
    keys = list(reward_extra[0]) if reward_extra else []
    for i, info in enumerate(reward_extra):
        if sorted(info) != sorted(keys):
            raise ValueError(f"reward_extra[{i}] has keys {sorted(info)}, the first has {sorted(keys)}: verl needs "
                             "the same keys for every trajectory")
    return {key: np.array([info[key] for info in reward_extra]) for key in keys}


def to_dataproto(trajectories: Sequence[Trajectory], pad_token_id: int, prompt_length: int | None = None,
                 response_length: int | None = None, columns: Mapping[str, np.ndarray] | None = None,
                 reward_extra: Sequence[Mapping[str, Any]] | None = None,
                 images: ImageExpander | None = None) -> DataProto:
    """One row per trajectory, in their order. ``columns``: the input batch's non-tensor columns (one value per
    trajectory), carried over; ``reward_extra``: per trajectory, the reward function's extra info; ``images``: the
    model's image processor (needed when a trajectory has pictures)."""
    failed = [(t.sample_id, t.error or t.termination.value) for t in trajectories if t.failed]
    if failed:
        raise FailedTrajectoriesError(failed, len(trajectories))
    for name, values in (columns or {}).items():
        if len(values) != len(trajectories):
            raise ValueError(f"column {name!r} has {len(values)} values for {len(trajectories)} trajectories")
    routed = sum(t.routed_experts is not None for t in trajectories)
    if 0 < routed < len(trajectories):  # verl would replay the zeros of the rows without routing
        raise ValueError(f"{routed} of {len(trajectories)} trajectories carry routed experts: verl's router replay "
                         "needs every row's")
    batch = to_batch(trajectories, pad_token_id, prompt_length, response_length)
    rows = list(trajectories)
    tensors = dict(batch.tensors)
    names: tuple[str, ...] = TENSORS
    if "routed_experts" in tensors:
        names += ("routed_experts",)
        tensors["routed_experts"] = tensors["routed_experts"].clamp(min=0)
    p = tensors["prompts"].size(1)
    last = (tensors["attention_mask"][:, p:].sum(dim=1) - 1).clamp(min=0)
    rm_scores = torch.zeros_like(tensors["response_mask"], dtype=torch.float32)
    rm_scores[torch.arange(len(rows)), last] = tensors["rewards"]
    tensors["rm_scores"] = rm_scores
    versions = [[v for v, m in zip(t.weight_versions, t.response_mask) if m] or [0] for t in rows]
    extra_columns = _reward_columns(reward_extra, len(rows)) if reward_extra is not None else {}
    non_tensor = {
        **(columns or {}),
        "uid": _objects([t.group_id or t.sample_id for t in rows]),
        "sample_id": _objects([t.sample_id for t in rows]),
        "__num_turns__": np.array([num_turns(t) for t in rows], dtype=np.int32),
        "multi_modal_inputs": _objects([multi_modal_inputs(t, images) for t in rows]),
        "tool_call_counts": np.array([t.tool_calls for t in rows], dtype=np.int32),
        "turn_scores": _objects([list(t.turn_scores) for t in rows]),
        "tool_rewards": _objects([list(t.tool_rewards) for t in rows]),
        "min_global_steps": _objects([min(v) for v in versions]),
        "max_global_steps": _objects([max(v) for v in versions]),
        "extras": _objects([{"termination": t.termination.value, "tool_calls": t.tool_calls} for t in rows]),
        **extra_columns,
    }
    if columns is not None and "uid" in columns:  # the trainer's own values (any type): its union compares them
        non_tensor["uid"] = columns["uid"]
    metrics = [{"generate_sequences": t.timings.generate_s, "tool_calls": t.timings.tools_s,
                "compute_score": t.timings.reward_s, "num_preempted": t.resumed_generations} for t in rows]
    return DataProto(
        batch=TensorDict({name: tensors[name] for name in names}, batch_size=len(rows)),
        non_tensor_batch=non_tensor,
        meta_info={"metrics": metrics, "reward_extra_keys": list(extra_columns)},
    )
