"""Do the engine and the trainer agree? The engine's logprob of every model token against a recompute by the
trainer's model, under the same weights.

A trainer's loss uses its own logprobs; the engine's are what the tokens were sampled from. They should differ
only by numerics when the weights are the same (a weight push that did not land shows up here at once). The
engine reports each logprob under the distribution it sampled from: the logits divided by the temperature and,
for constrained tool calls, masked by the call grammar. So two recomputes are offered:

- ``policy``: the trainer's distribution (logits / temperature), what the loss and TRL's importance sampling use;
  on constrained turns it differs from the engine's by the probability mass the grammar removed, by design;
- ``sampler``: the same with the grammar's mask replayed token by token, which must match the engine's to
  numerical precision when the weights match.

A MoE model's recompute can replay the rollout's routing (``replay``: a trajectory's context in which the model's
forward routes its tokens to the engine's experts, ``trl/routing_replay.py``), as its training forward does; without
it a token whose top-k the two routers break differently is another model's, and the difference shows here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from agentloop_grpc.agent import Trajectory


@dataclass(frozen=True, slots=True)
class LogprobDiff:
    """|engine - trainer| over the model tokens of the trajectories compared."""

    tokens: int
    mean_abs: float
    max_abs: float

    @classmethod
    def of(cls, engine: Sequence[float], trainer: Sequence[float]) -> LogprobDiff:
        diffs = [abs(a - b) for a, b in zip(engine, trainer, strict=True)]
        return cls(len(diffs), statistics.fmean(diffs) if diffs else 0.0, max(diffs, default=0.0))


def recompute_logprobs(model, trajectory: Trajectory, temperature: float = 1.0, grammar=None) -> list[float]:
    """The trainer model's logprob of each model token of ``trajectory``, in order (one forward pass).

    ``temperature``: the rollout's (0 means greedy, whose logprobs engines report at temperature 1).
    ``grammar``: an ``xgrammar.CompiledGrammar`` to replay on every assistant turn (the ``sampler`` recompute),
    or None (the ``policy`` recompute).
    """
    return _recompute(_logits(model, trajectory, temperature), trajectory, grammar)


def compare(model, trajectories: Sequence[Trajectory], temperature: float,
            grammar: Callable[[Trajectory], Any] | None = None,
            version: int | None = None,
            replay: Callable[[Trajectory], AbstractContextManager] | None = None) -> tuple[LogprobDiff, LogprobDiff]:
    """(policy, sampler): engine logprobs against both recomputes over every model token of ``trajectories``,
    from one forward pass each; ``grammar`` gives a constrained trajectory's compiled grammar (the one its
    sample's offered tools made), None to skip the sampler recompute (then it equals the policy's).
    ``version``: only the tokens made by that weight version (the trainer's, when others made the rest).
    ``replay``: the context each trajectory's forward runs in (routing replay), None: the model's own routing."""
    engine, policy, sampler = [], [], []
    for t in trajectories:
        keep = [version is None or v == version for v, m in zip(t.weight_versions, t.response_mask, strict=True) if m]
        if not any(keep):
            continue
        with replay(t) if replay is not None else nullcontext():
            logits = _logits(model, t, temperature)
        engine += _kept([lp for lp, m in zip(t.response_logprobs, t.response_mask, strict=True) if m], keep)
        own = _recompute(logits, t, None)
        policy += _kept(own, keep)
        sampler += _kept(_recompute(logits, t, grammar(t)) if grammar is not None and t.constrained else own, keep)
    return LogprobDiff.of(engine, policy), LogprobDiff.of(engine, sampler)


def _kept(values: list[float], keep: list[bool]) -> list[float]:
    return [v for v, k in zip(values, keep, strict=True) if k]


def _logits(model, trajectory: Trajectory, temperature: float):
    import torch

    ids = list(trajectory.prompt_ids) + list(trajectory.response_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return logits / temperature if temperature > 0 else logits


def _recompute(logits, trajectory: Trajectory, grammar) -> list[float]:
    import torch

    start = len(trajectory.prompt_ids)
    replay = _GrammarReplay(grammar, logits.shape[-1]) if grammar is not None else None
    out = []
    for i, (token, mask) in enumerate(zip(trajectory.response_ids, trajectory.response_mask, strict=True)):
        if not mask:
            if replay is not None:
                replay.new_turn()  # the next model token opens a new assistant turn
            continue
        row = logits[start + i - 1]
        if replay is not None:
            row = replay.mask(row, token)
        out.append(float(torch.log_softmax(row, dim=-1)[token]))
    return out


class _GrammarReplay:
    """The grammar's token mask at each step of an assistant turn, as the engine applied it."""

    def __init__(self, grammar, vocab_size: int) -> None:
        import xgrammar

        self._xgrammar = xgrammar
        self._grammar = grammar
        self._vocab = vocab_size
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._matcher: Any = None  # xgrammar is imported lazily: its GrammarMatcher has no name here

    def new_turn(self) -> None:
        self._matcher = None

    def mask(self, row, token: int):
        import torch

        if self._matcher is None:
            self._matcher = self._xgrammar.GrammarMatcher(self._grammar)
        if self._matcher.is_terminated():
            return row
        self._matcher.fill_next_token_bitmask(self._bitmask)
        allowed = torch.zeros(1, self._vocab)
        self._xgrammar.apply_token_bitmask_inplace(allowed, self._bitmask, vocab_size=self._vocab)
        self._matcher.accept_token(token)
        return row.masked_fill(allowed[0] != 0.0, float("-inf"))
