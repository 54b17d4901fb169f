"""TokenGrouper: groups an engine's token chunks into fewer Generate messages, as the caller's StreamOptions ask.

Every message costs both ends CPU (gRPC framing plus Python on each side), which
dominates when thousands of generations run at once and their callers only want the result. Engines keep
producing chunks as they decode; the servicer passes them through a grouper, which holds tokens until enough are
pending (or, for ``final_only``, until the end) and hands back what to send. Tokens of different weight versions
are never merged, so each message keeps one version and per-token versions stay exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from agentloop_grpc.common.types import TokenChunk


def merge_chunks(chunks: Sequence[TokenChunk]) -> list[TokenChunk]:
    """The tokens (and logprobs) of ``chunks`` in order, one chunk per run of one weight version.

    The one place chunks are merged: the grouper, and the fake and embedded engines for a slow reader. Tokens of
    different weight versions are never merged, so every token keeps the version that produced it.
    """
    if len(chunks) <= 1:
        return list(chunks)
    merged = []
    for version, group in itertools.groupby(chunks, key=lambda chunk: chunk.weight_version):
        run = list(group)
        merged.append(run[0] if len(run) == 1 else TokenChunk(
            token_ids=tuple(t for c in run for t in c.token_ids),
            weight_version=version,
            logprobs=tuple(lp for c in run for lp in c.logprobs),
            top_logprobs=tuple(alts for c in run for alts in c.top_logprobs),
            routed_experts=b"".join(c.routed_experts for c in run),
        ))
    return merged


class TokenGrouper:
    """Holds chunks until ``min_chunk_tokens`` are pending (never, when ``final_only``); see the module docstring."""

    def __init__(self, min_chunk_tokens: int, final_only: bool) -> None:
        self._threshold = None if final_only else max(1, min_chunk_tokens)
        self._pending: list[TokenChunk] = []
        self._pending_tokens = 0

    def add(self, chunk: TokenChunk) -> list[TokenChunk]:
        """Take the engine's next chunk; return the chunks to send now (often none)."""
        ready = []
        if self._pending and self._pending[0].weight_version != chunk.weight_version:
            ready.append(self._take())
        self._pending.append(chunk)
        self._pending_tokens += len(chunk.token_ids)
        if self._threshold is not None and self._pending_tokens >= self._threshold:
            ready.append(self._take())
        return ready

    def tail(self) -> TokenChunk | None:
        """The tokens still pending at the end (they travel in GenerateComplete.tokens), or None."""
        return self._take() if self._pending else None

    def _take(self) -> TokenChunk:
        (merged,) = merge_chunks(self._pending)  # pending holds one weight version (see ``add``)
        self._pending = []
        self._pending_tokens = 0
        return merged
