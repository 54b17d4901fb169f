"""Rollout routing replay (R3): a MoE model's training forward routes each token to the experts the inference
engine routed it to, so the policy the trainer updates is the one that sampled.

Engine and trainer compute a router's logits with different kernels (and, between weight pushes, different
weights); a token whose top-k is nearly tied then goes to other experts in training, and its logprob, the
importance ratio and the gradient are a different model's. Replay forces the recorded top-k expert ids
(``Trajectory.routed_experts``, ``to_batch``'s ``routed_experts``: ``[B, T, moe layers, top-k]``, -1 where
unknown) at every position that has them; the weights of those experts still come from the trainer's own gate
logits, through the router's own softmax and top-k normalisation, so the gate is trained as before. Positions
without a recording (-1: padding, a tool result after the last turn, a row without routing) keep the model's own
top-k.

``RoutingReplay(model)`` hooks the routers while it is open (a ``with`` block); ``bind`` sets the routing of the
next forwards (and of their recompute under gradient checkpointing, which runs in the backward pass: keep the block
open through it). Nothing is global: the routing lives in the instance, and the hooks go when the block closes.

Supported: transformers' Qwen3-MoE (``Qwen3MoeSparseMoeBlock``, what the embedded engine serves); another MoE
architecture is refused by name (``UnsupportedMoeError``), never routed natively in silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter

from agentloop_grpc.agent.trajectory import Trajectory
from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.routed_experts import Routing

_MOE_MODULE = re.compile(r"moe|expert|router", re.IGNORECASE)
SUPPORTED = ("qwen3_moe",)


class UnsupportedMoeError(ValueError):
    """The model is a mixture of experts whose router routing replay does not know."""


def moe_routers(model: nn.Module) -> tuple[Qwen3MoeTopKRouter, ...]:
    """``model``'s MoE routers in decoder-layer order, MoE layers only (the contract's layer numbering, dense
    layers skipped); ``()`` for a dense model. UnsupportedMoeError for a MoE architecture not supported."""
    routers = []
    for module in model.modules():
        if isinstance(module, Qwen3MoeSparseMoeBlock):
            if type(module.gate) is not Qwen3MoeTopKRouter:  # a patched or replaced router: its outputs may differ
                raise UnsupportedMoeError(f"a Qwen3-MoE block's router is {type(module.gate).__name__}, not "
                                          "Qwen3MoeTopKRouter: routing replay cannot force its experts")
            routers.append(module.gate)
    if routers:
        return tuple(routers)
    modules = sorted({type(m).__name__ for m in model.modules() if _MOE_MODULE.search(type(m).__name__)})
    config = getattr(model, "config", None)  # a PreTrainedModel's; a bare module has none
    if config is not None:
        replays(config, modules)
    elif modules:
        _refuse(type(model).__name__, ", ".join(modules))
    return ()


def replays(config: Any, modules: Sequence[str] = ()) -> bool:
    """From a checkpoint's config (``PretrainedConfig``), before loading it: whether routing replay drives it (a
    supported MoE), False for a dense model; UnsupportedMoeError for a MoE architecture it does not know
    (``modules``: the names of a loaded model's MoE-looking modules, evidence beside the config's expert count)."""
    text = config.get_text_config()
    kind = getattr(text, "model_type", "")
    if kind in SUPPORTED:
        return True
    experts = routed_experts.expert_count(text)
    if experts > 1 or modules:
        _refuse(kind, ", ".join(modules) or f"{experts} experts")
    return False


def _refuse(kind: str, evidence: str) -> None:
    raise UnsupportedMoeError(f"routing replay does not know the router of {kind} ({evidence}); supported: "
                              f"{', '.join(SUPPORTED)}. Turn it off to train without (routing_replay: false)")


def is_moe(model: nn.Module) -> bool:
    """Whether ``model`` has MoE routers routing replay drives (UnsupportedMoeError for an unknown MoE)."""
    return bool(moe_routers(model))


class RoutingReplay:
    """Forces recorded experts in ``model``'s MoE routers while open (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE router: there is no routing to replay")
        self.top_k = self.routers[0].top_k
        self.num_experts = self.routers[0].num_experts
        self._routing: torch.Tensor | None = None  # [B*T, layers, top_k], long
        self._handles: list[Any] = []
        # (replayed, rerouted) (position, layer) pairs over the forwards so far, as tensors: no sync per layer
        self._counts: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def layers(self) -> int:
        return len(self.routers)

    def rerouted_share(self) -> float | None:
        """Of the (position, MoE layer) pairs replayed since the block opened, the share where the model's own
        router picked other experts than the recording (what replay changed; a share near 1 would say the routing
        is not these tokens'); None when nothing was replayed."""
        if not self._counts:
            return None
        replayed = sum(float(r) for r, _ in self._counts)
        return sum(float(d) for _, d in self._counts) / replayed if replayed else None

    def __enter__(self) -> RoutingReplay:
        self._handles = [router.register_forward_hook(self._hook(layer))
                         for layer, router in enumerate(self.routers)]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._routing = None

    def bind(self, routed_experts: torch.Tensor | None) -> None:
        """The routing of the next forwards: ``[B, T, layers, top_k]`` aligned with their ``input_ids`` (-1 where
        unknown), or None to route natively."""
        if routed_experts is None:
            self._routing = None
            return
        if routed_experts.dim() != 4 or tuple(routed_experts.shape[2:]) != (self.layers, self.top_k):
            raise ValueError(f"routing of shape {tuple(routed_experts.shape)} is not [batch, tokens, {self.layers} "
                             f"MoE layers, top-{self.top_k}] of this model")
        if int(routed_experts.max()) >= self.num_experts or int(routed_experts.min()) < -1:
            raise ValueError(f"routing names experts outside 0..{self.num_experts - 1} (-1: unknown)")
        self._routing = routed_experts.reshape(-1, self.layers, self.top_k).long()

    def _hook(self, layer: int):
        def replay(router: Qwen3MoeTopKRouter, _inputs: Any, output: tuple[torch.Tensor, ...]):
            if self._routing is None:
                return output
            logits, _, indices = output
            if logits.size(0) != self._routing.size(0):
                raise ValueError(f"a forward of {logits.size(0)} positions, the bound routing has "
                                 f"{self._routing.size(0)}: bind the routing of this forward's batch")
            recorded = self._routing[:, layer].to(indices.device)
            known = (recorded >= 0).all(dim=-1, keepdim=True)
            forced = torch.where(known, recorded, indices)
            own = (indices.sort(dim=-1).values != recorded.sort(dim=-1).values).any(dim=-1, keepdim=True)
            self._counts.append((known.sum(), (known & own).sum()))
            # Qwen3MoeTopKRouter.forward's weights, at the forced experts
            probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
            weights = probs.gather(-1, forced)
            if router.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), forced

        return replay


@contextmanager
def replay_routing(model: nn.Module, routed_experts: torch.Tensor | None) -> Iterator[None]:
    """Forwards of ``model`` in this block replay ``routed_experts`` (None: a no-op, for callers that replay only
    when they have routing)."""
    if routed_experts is None:
        yield
        return
    with RoutingReplay(model) as replay:
        replay.bind(routed_experts)
        yield


def left_padded_routing(routings: Sequence[Routing | None], prompt_lengths: Sequence[int], prompt_width: int,
                        width: int) -> torch.Tensor | None:
    """Each row's routing placed in a batch whose prompts are left-padded to ``prompt_width`` and whose rows are
    ``width`` long (TRL's prompt + completion tensors): int16 ``[rows, width, layers, top_k]``, -1 where unknown
    (padding, positions a row's routing does not cover, rows without one); None when no row has routing."""
    rows = routed_experts.placed(routings, [prompt_width - length for length in prompt_lengths], width)
    return None if rows is None else torch.from_numpy(rows)


def trajectory_replay(model: nn.Module, trajectory: Trajectory) -> AbstractContextManager:
    """The context in which one forward of ``trajectory``'s prompt + response ids replays its routing (no
    replay when it has none)."""
    if trajectory.routed_experts is None:
        return nullcontext()
    prompt, width = len(trajectory.prompt_ids), len(trajectory.prompt_ids) + len(trajectory.response_ids)
    return replay_routing(model, left_padded_routing([trajectory.routed_experts], [prompt], prompt, width))
