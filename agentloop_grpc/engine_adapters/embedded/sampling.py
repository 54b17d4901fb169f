"""Sampling of one row of logits, with the per-request state that makes it reproducible.

Order of processing (as in vLLM): penalties on the raw logits, then the structured-output mask, then
temperature, top-k, top-p and min-p; the token is drawn from the softmax of what is left.

Logprobs: the reported logprob (and the top alternatives) are under the distribution the token was actually
drawn from, i.e. after every step above. Greedy requests (temperature 0) draw from a point mass, which says
nothing; for them we report the log-softmax of the penalised, masked logits at temperature 1 without
truncation (the model's own distribution). With default sampling parameters both definitions coincide with
the model's raw distribution, which is what a trainer recomputes.

Reproducibility: each request owns a ``torch.Generator`` (seeded from its seed, or from fresh entropy), and
draws exactly one multinomial sample per token from its own row, so what else is in the batch never changes
its random stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from agentloop_grpc.common.types import SamplingParams

NEG_INF = float("-inf")


@dataclass(frozen=True, slots=True)
class SampledToken:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class RequestSampler:
    """The sampling state of one request: its generator and the token counts penalties need."""

    def __init__(self, params: SamplingParams, prompt_ids: tuple[int, ...], vocab_size: int) -> None:
        self.params = params
        self.generator = torch.Generator()
        self.generator.manual_seed(params.seed if params.seed is not None else random.SystemRandom().getrandbits(63))
        self._uses_penalties = (
            params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        )
        self._seen = torch.zeros(vocab_size, dtype=torch.bool)  # prompt + output (repetition penalty)
        self._counts = torch.zeros(vocab_size, dtype=torch.float32)  # output only (presence / frequency)
        if self._uses_penalties:
            self._seen[list(prompt_ids)] = True

    def observe(self, token: int) -> None:
        if self._uses_penalties:
            self._seen[token] = True
            self._counts[token] += 1

    def _penalise(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if p.repetition_penalty != 1.0:
            seen = logits[self._seen]
            logits[self._seen] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if p.frequency_penalty != 0.0:
            logits -= p.frequency_penalty * self._counts
        if p.presence_penalty != 0.0:
            logits -= p.presence_penalty * (self._counts > 0).to(logits.dtype)
        return logits

    def _truncate(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p and min-p on a row of logits (returns the processed logits)."""
        p = self.params
        logits = logits / p.temperature
        if 0 < p.top_k < logits.shape[0]:
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, NEG_INF)
        if p.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
            drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
            logits = logits.clone()
            logits[order[drop]] = NEG_INF
        if p.min_p > 0.0:
            probs = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(probs < p.min_p * probs.max(), NEG_INF)
        return logits

    def sample(self, logits: torch.Tensor, allowed: torch.Tensor | None) -> SampledToken:
        """Choose the next token from one row of raw logits (``allowed``: structured-output mask or None)."""
        logits = logits.clone() if self._uses_penalties or allowed is not None else logits
        if self._uses_penalties:
            logits = self._penalise(logits)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, NEG_INF)
        if self.params.greedy:
            token = int(torch.argmax(logits))
            if not (self.params.logprobs or self.params.top_logprobs):  # a full-vocabulary softmax nobody reads
                return SampledToken(token, 0.0, ())
            logprobs = torch.log_softmax(logits, dim=-1)
        else:
            logprobs = torch.log_softmax(self._truncate(logits), dim=-1)
            token = int(torch.multinomial(logprobs.exp(), 1, generator=self.generator))
        return self._result(token, logprobs)

    def _result(self, token: int, logprobs: torch.Tensor) -> SampledToken:
        p = self.params
        if not (p.logprobs or p.top_logprobs):
            return SampledToken(token, 0.0, ())
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            values, ids = torch.topk(logprobs, p.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist()))
        return SampledToken(token, float(logprobs[token]), top)
