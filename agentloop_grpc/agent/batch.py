"""The trainer boundary: trajectories -> padded tensors, built once, here.

Layout (verl's): ``input_ids = [prompt left-padded to P | response right-padded to R]``; ``attention_mask`` 1 on
real tokens; ``position_ids`` count real tokens only; ``response_mask`` 1 on model tokens; ``rollout_log_probs``
aligned with the response; ``token_level_rewards`` holds the reward on the last model token. The pad id is
passed in: no shared tokenizer's ``padding_side`` is touched. Failed trajectories are left out by default (they
must not be trained on); their ids are listed. ``media`` holds each row's pictures with their spans moved to the
row's place in ``input_ids``. ``routed_experts`` (when a row carries routing, a MoE model's routing replay):
int16 ``[B, P + R, layers, top-k]`` aligned with ``input_ids``, -1 where unknown (padding, the last position, rows
without routing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.media import MediaInput

from .trajectory import Trajectory


@dataclass(frozen=True)
class TrainerBatch:
    tensors: dict = field(repr=False)  # name -> torch.Tensor, first dimension = trajectories
    sample_ids: tuple[str, ...]
    group_ids: tuple[str, ...]
    #: Samples left out because their trajectory failed.
    excluded: tuple[str, ...] = ()
    #: Per row, its pictures with spans as offsets in the row of ``input_ids``.
    media: tuple[tuple[MediaInput, ...], ...] = ()

    def save(self, path: str | Path) -> None:
        import torch

        media = [[{"mime_type": m.mime_type, "data": m.data, "offset": m.offset, "length": m.length} for m in row]
                 for row in self.media]
        torch.save(
            {"tensors": self.tensors, "sample_ids": list(self.sample_ids), "group_ids": list(self.group_ids),
             "excluded": list(self.excluded), "media": media},
            Path(path),
        )


def _in_row(t: Trajectory, prompt_length: int) -> tuple[MediaInput, ...]:
    """``t``'s pictures moved from prompt + response offsets to the padded row's (the left padding before both)."""
    return tuple(m.moved(prompt_length - len(t.prompt_ids) + m.offset) for m in t.media)


def to_batch(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    include_failed: bool = False,
) -> TrainerBatch:
    import torch

    kept = [t for t in trajectories if include_failed or not t.failed]
    excluded = tuple(t.sample_id for t in trajectories if t not in kept)
    if not kept:
        raise ValueError("no trajectory to batch (all failed, or none given)")
    p = prompt_length if prompt_length is not None else max(len(t.prompt_ids) for t in kept)
    r = response_length if response_length is not None else max(max(len(t.response_ids) for t in kept), 1)
    for t in kept:
        if len(t.prompt_ids) > p or len(t.response_ids) > r:
            raise ValueError(
                f"trajectory {t.sample_id} ({len(t.prompt_ids)} prompt / {len(t.response_ids)} response tokens) "
                f"does not fit prompt_length={p} / response_length={r}"
            )
    b = len(kept)
    input_ids = torch.full((b, p + r), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, p + r), dtype=torch.long)
    response_mask = torch.zeros((b, r), dtype=torch.long)
    logprobs = torch.zeros((b, r), dtype=torch.float32)
    versions = torch.full((b, r), -1, dtype=torch.long)
    token_rewards = torch.zeros((b, r), dtype=torch.float32)
    for i, t in enumerate(kept):
        n_prompt, n_response = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, p - n_prompt : p] = torch.tensor(t.prompt_ids, dtype=torch.long)
        attention[i, p - n_prompt : p] = 1
        if n_response:
            input_ids[i, p : p + n_response] = torch.tensor(t.response_ids, dtype=torch.long)
            attention[i, p : p + n_response] = 1
            response_mask[i, :n_response] = torch.tensor(t.response_mask, dtype=torch.long)
            logprobs[i, :n_response] = torch.tensor(t.response_logprobs, dtype=torch.float32)
            versions[i, :n_response] = torch.tensor(t.weight_versions, dtype=torch.long)
        model_positions = [j for j, m in enumerate(t.response_mask) if m]
        if model_positions:
            token_rewards[i, model_positions[-1]] = t.reward
    routing = routed_experts.placed([t.routed_experts for t in kept], [p - len(t.prompt_ids) for t in kept], p + r)
    position_ids = torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0)
    tensors = {
        "prompts": input_ids[:, :p].clone(),
        "responses": input_ids[:, p:].clone(),
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_log_probs": logprobs,
        "weight_versions": versions,
        "token_level_rewards": token_rewards,
        "rewards": torch.tensor([t.reward for t in kept], dtype=torch.float32),
    }
    if routing is not None:
        tensors["routed_experts"] = torch.from_numpy(routing)
    return TrainerBatch(tensors, tuple(t.sample_id for t in kept), tuple(t.group_id for t in kept), excluded,
                        tuple(_in_row(t, p) for t in kept))
