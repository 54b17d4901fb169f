"""CorrectedGRPOTrainer: TRL's GRPOTrainer with the rollout correction (``correction.py``) on a ``rollout_func``.

TRL (1.16) takes the ``rollout_func``'s ``logprobs`` as the sampling policy's but corrects with them only when it
generates with vLLM itself (``use_vllm``), which a ``rollout_func`` of ours never sets: a group sampled at version
v-1 and trained at v would be trained as if on-policy. This subclass does, after TRL made a step's batch:

1. the trainer's recompute of every completion token under the weights it trains now (one forward pass without
   gradients, as TRL's vLLM path does; reused when TRL made it itself), set as ``old_per_token_logps`` (the
   proximal policy of the decoupled objective; with one update per rollout it equals the loss's own logprobs);
2. the weights of ``correction`` from the recompute against the engine's logprobs, on model tokens
   (``env_mask``), less a constrained trajectory's when ``correction.constrained`` is ``exclude``;
3. the weights folded into per-token advantages, a (B, T) tensor, which TRL's loss takes as it is. For w >= 0,
   -min(r A w, clip(r) A w) = w (-min(r A, clip(r) A)), so this is the loss TRL's own importance sampling makes,
   for every loss type but vespo (whose gamma weight reads the sequence's ratio, not the advantage's size);
4. the step's metrics (``correction/...``, by version lag from the ``agentloop_weight_versions`` field) into TRL's
   logs, which reach its trackers and ``agentloop train``'s metrics.

``correction=None``: GRPOTrainer, unchanged (no extra forward pass); nor is there one for a batch with no token to
weigh (every trajectory constrained and left out).

Routing replay (``routing_replay.py``, on by default for a MoE model, ``routing_replay=False`` turns it off): the
rollout's routing (the ``agentloop_routed_experts`` field) is placed beside TRL's left-padded prompt and
right-padded completion tensors as ``routed_experts``, which TRL shuffles and splits with the rest, and every
forward of the policy (the loss's, its backward recompute, the recompute above) routes the recorded tokens to the
engine's experts. ``routing_replay/rows`` logs the share of a step's rows that carried routing,
``routing_replay/rerouted_share`` the share of replayed (token, MoE layer) pairs whose own routing differed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from trl import GRPOTrainer

from .correction import RolloutCorrection, correction_metrics, importance_weights
from .routing_replay import RoutingReplay, is_moe, left_padded_routing, replay_routing


class CorrectedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer's arguments, and ``correction`` (None: none) and ``version_of`` (the weight version the trainer
    trains after a number of optimizer steps: the rollout's ``clock.version_of``, so both count versions alike,
    also for a resumed trainer; without one, step s trains version s) and ``routing_replay`` (replay the
    rollout's routing in a MoE model's forwards; UnsupportedMoeError for a MoE architecture it does not know)."""

    def __init__(self, *args: Any, correction: RolloutCorrection | None = None,
                 version_of: Callable[[int], int] | None = None, routing_replay: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.correction = correction
        self.version_of = version_of or (lambda step: step)
        self.routing_replay = routing_replay and is_moe(self.accelerator.unwrap_model(self.model))
        self._replay: RoutingReplay | None = None  # open for one training step (forward and backward)
        self._rolled: dict[str, list] | None = None
        if self.rollout_func is not None:
            # TRL keeps only the tensors it knows; the fields the weights need (versions, constrained) are kept here
            inner = self.rollout_func

            def recorded(prompts: list, trainer) -> dict[str, list]:
                self._rolled = inner(prompts, trainer)
                return self._rolled

            self.rollout_func = recorded

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        rolled, self._rolled = self._rolled, None
        if self.routing_replay and rolled is not None and "agentloop_routed_experts" in rolled:
            routings = rolled["agentloop_routed_experts"]
            routing = left_padded_routing(routings, out["prompt_mask"].sum(dim=1).tolist(), out["prompt_ids"].size(1),
                                          out["prompt_ids"].size(1) + out["completion_ids"].size(1))
            self._metrics["train"]["routing_replay/rows"].append(sum(r is not None for r in routings) / len(routings))
            if routing is not None:
                out["routed_experts"] = routing.to(out["prompt_ids"].device)
                if out.get("old_per_token_logps") is not None:  # TRL's, made without the routing
                    out["old_per_token_logps"] = self._recompute(out, out["completion_ids"].size(1))
        if self.correction is None or rolled is None or self.model is None or not self.model.training:
            return out
        behaviour = out.get("sampling_per_token_logps")
        if behaviour is None:
            return out
        completion_ids = out["completion_ids"]
        length = completion_ids.size(1)
        model_tokens = out["completion_mask"].bool()
        if "tool_mask" in out:
            model_tokens &= out["tool_mask"].bool()
        corrected = model_tokens.clone()
        if self.correction.constrained == "exclude" and "agentloop_constrained" in rolled:
            constrained = torch.tensor(rolled["agentloop_constrained"], dtype=torch.bool, device=corrected.device)
            corrected &= ~constrained.unsqueeze(1)
        old = out.get("old_per_token_logps")
        if old is None and corrected.any():  # nothing to weigh (every token constrained): no forward for weights 1
            old = self._recompute(out, length)
        weights = importance_weights(behaviour if old is None else old, behaviour, corrected, self.correction)
        if old is not None:
            out["old_per_token_logps"] = old
        advantages = out["advantages"]
        out["advantages"] = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * weights.weights
        lag = None
        if "agentloop_weight_versions" in rolled:
            versions = torch.full(corrected.shape, -1, dtype=torch.long)
            for row, made_by in enumerate(rolled["agentloop_weight_versions"]):
                versions[row, : len(made_by)] = torch.tensor(made_by, dtype=torch.long)
            lag = torch.where(versions >= 0, self.version_of(int(self.state.global_step)) - versions, -1)
            lag = lag.to(corrected.device)
        for key, value in correction_metrics(weights, lag, self.correction).items():
            self._metrics["train"][key].append(value)
        excluded = model_tokens & ~corrected
        self._metrics["train"]["correction/excluded_constrained_tokens"].append(float(excluded.sum()))
        return out

    def _recompute(self, out: dict, length: int) -> torch.Tensor:
        """The trainer model's logprob of every completion token, under the weights it trains now (with the
        rollout's routing, when it is replayed)."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        routing = out.get("routed_experts")
        chunk = self.args.per_device_train_batch_size
        if routing is None:
            chunk = ids.size(0)
        logps = []
        with torch.no_grad():
            for start in range(0, ids.size(0), chunk):
                rows = slice(start, start + chunk)
                with replay_routing(self.accelerator.unwrap_model(self.model),
                                    None if routing is None else routing[rows]):
                    logps.append(self._get_per_token_logps_and_entropies(
                        self.model, ids[rows], mask[rows], length, batch_size=self.args.per_device_train_batch_size)[0])
        return torch.cat(logps)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's step; with routing replay, the routers are hooked through the forward and the backward (whose
        gradient checkpointing recomputes the forward), ``compute_loss`` binds the micro-batch's routing."""
        if not self.routing_replay:
            return super().training_step(model, inputs, num_items_in_batch)
        with RoutingReplay(self.accelerator.unwrap_model(model)) as replay:
            self._replay = replay
            try:
                loss = super().training_step(model, inputs, num_items_in_batch)
            finally:
                self._replay = None
            share = replay.rerouted_share()
        if share is not None:
            self._metrics["train"]["routing_replay/rerouted_share"].append(share)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._replay is not None:
            self._replay.bind(inputs.get("routed_experts"))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
