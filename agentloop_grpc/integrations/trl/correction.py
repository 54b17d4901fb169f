"""Rollout correction: importance weights for tokens that an older policy (or another engine's numerics) sampled.

Every model token records what sampled it: the engine's logprob (the behaviour policy mu, at the weight version the
token records). The trainer's loss is an expectation under its own policy pi (the weights it trains now), so a
token's gradient term is weighted by w = pi(token) / mu(token) = exp(trainer logprob - engine logprob). Fresh
tokens (made by the trainer's current weights) have w = 1 up to numerics; stale ones (fully-async: the group
started before the last push) are corrected by how far the policy moved since.

Modes (the names users know from TRL's ``vllm_importance_sampling_mode``, verl's rollout correction and slime):

- ``token_truncate``: each token's w, clamped to [low, high] (truncated IS, TIS);
- ``token_mask``: each token's w, set to 0 outside [low, high] (masked IS, MIS);
- ``sequence_truncate`` / ``sequence_mask``: one w per trajectory, the product over its corrected tokens, clamped
  or masked likewise, weighting each of them;
- ``decoupled``: AReaL's decoupled PPO objective: the PPO ratio is taken against the proximal policy (the trainer's
  recompute before the update) and each token's loss is weighted by w = proximal / behaviour, set to 0 above
  ``high`` (AReaL's ``behav_imp_weight_cap``), with no lower bound.

Only the tokens in ``corrected`` are weighted (model tokens, less those left out: a constrained trajectory's, see
``docs/trl.md``); every other token keeps weight 1. Log ratios are clamped to [-20, 20] before ``exp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Mode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "decoupled"]
MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "decoupled")
_LOG_CLAMP = 20.0  # exp(20) ~ 5e8: far beyond any bound, still finite in float32


@dataclass(frozen=True, slots=True)
class RolloutCorrection:
    """How the weights are made: ``mode`` (see the module docstring), the bounds ``low`` and ``high`` (None: that
    side unbounded), and ``constrained``: ``exclude`` (a constrained trajectory's tokens keep weight 1) or
    ``include`` (weighted against the grammar-masked logprobs the engine reported)."""

    mode: Mode = "token_truncate"
    low: float | None = None
    high: float | None = 2.0
    constrained: Literal["exclude", "include"] = "exclude"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"correction mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.constrained not in ("exclude", "include"):
            raise ValueError(f"correction constrained {self.constrained!r}: exclude or include")
        if self.low is not None and self.low < 0:
            raise ValueError("correction low must be >= 0")
        if self.low is not None and self.high is not None and self.low >= self.high:
            raise ValueError("correction low must be below high")
        if self.mode == "decoupled" and (self.low is not None or self.high is None):
            raise ValueError("decoupled: set high (the cap above which a token is masked) and no low")

    @property
    def sequence(self) -> bool:
        return self.mode.startswith("sequence")

    @property
    def masks(self) -> bool:
        return self.mode.endswith("mask") or self.mode == "decoupled"


@dataclass(frozen=True)
class Weights:
    """The weights of a batch, all (B, T): ``weights`` multiplies each token's loss term (1 where not corrected);
    ``ratio`` is pi / mu before the bounds (sequence modes: the trajectory's, on each of its corrected tokens);
    ``corrected``: the tokens in the ratio; ``bounded``: those the bounds truncated or masked."""

    weights: torch.Tensor
    ratio: torch.Tensor
    corrected: torch.Tensor
    bounded: torch.Tensor


def importance_weights(trainer_logps: torch.Tensor, behaviour_logps: torch.Tensor, corrected: torch.Tensor,
                       correction: RolloutCorrection) -> Weights:
    """The weights of ``correction`` for (B, T) logprobs; ``corrected``: (B, T) bool, the tokens to weight."""
    import torch

    corrected = corrected.bool()
    log_ratio = torch.where(corrected, trainer_logps.detach().float() - behaviour_logps.float(), 0.0)
    if correction.sequence:
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    ratio = torch.where(corrected, torch.exp(log_ratio.clamp(-_LOG_CLAMP, _LOG_CLAMP)), 1.0)
    low = correction.low if correction.low is not None else 0.0
    high = correction.high if correction.high is not None else float("inf")
    bounded = corrected & ((ratio < low) | (ratio > high))
    weights = torch.where(bounded, 0.0, ratio) if correction.masks else ratio.clamp(min=low, max=high)
    return Weights(torch.where(corrected, weights, 1.0), ratio, corrected, bounded)


def correction_metrics(weights: Weights, lag: torch.Tensor | None, correction: RolloutCorrection,
                       prefix: str = "correction/") -> dict[str, float]:
    """The step's figures: the ratio's (the weight before the bounds) mean, min and max, the share the bounds
    truncated or masked, the tokens corrected; then the same per version lag (``lag``: (B, T) versions behind the
    trainer, None: unknown) as ``lag_K/...`` (a negative lag: no version recorded, left out). Sequence modes count
    trajectories, at their oldest token's lag."""
    import torch

    bounded_name = "masked_share" if correction.masks else "truncated_share"
    if correction.sequence:
        rows = weights.corrected.any(dim=-1)
        # every corrected token of a trajectory carries its ratio (> 0): the row's max is it
        ratio = torch.where(weights.corrected, weights.ratio, 0.0).amax(dim=-1)[rows]
        bounded = weights.bounded.any(dim=-1)[rows]
        lags = None if lag is None else torch.where(weights.corrected, lag, -1).max(dim=-1).values[rows]
    else:
        ratio, bounded = weights.ratio[weights.corrected], weights.bounded[weights.corrected]
        lags = None if lag is None else lag[weights.corrected]

    def figures(keep: torch.Tensor | None, name: str) -> dict[str, float]:
        r, b = (ratio, bounded) if keep is None else (ratio[keep], bounded[keep])
        if r.numel() == 0:
            return {f"{name}count": 0.0}
        return {f"{name}ratio_mean": float(r.mean()), f"{name}ratio_min": float(r.min()),
                f"{name}ratio_max": float(r.max()), f"{name}{bounded_name}": float(b.float().mean()),
                f"{name}count": float(r.numel())}

    out = figures(None, prefix)
    if lags is not None:
        for k in sorted({int(v) for v in lags.tolist() if v >= 0}):
            out.update(figures(lags == k, f"{prefix}lag_{k}/"))
    return out
