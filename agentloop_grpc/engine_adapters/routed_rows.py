"""A finished request's routed experts split over its chunks, for engines that report routing only when a request
ends (vLLM 0.32, SGLang 0.5.23): those adapters hold a routed request's chunks until then.

The rows are packed as agentloop.v1 packs them (``common/routed_experts.py``), one per input position of
``prompt + output[:-1]`` (docs/contract.md's alignment): the first ``prompt_tokens - 1`` are the prompt's, then one
per output token in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentloop_grpc.common.types import TokenChunk


def split_rows(
    packed: bytes, row_bytes: int, prompt_tokens: int, chunks: Sequence[TokenChunk], engine: str
) -> tuple[bytes, list[TokenChunk]]:
    """The prompt's routing, and ``chunks`` (every output token of the request, in order) each with its tokens'.
    A request that ended before its first token has nothing to report (b"", as the embedded engine); one with
    tokens must have a row for each position, or the engine is at fault (never empty or misaligned routing)."""
    generated = sum(len(chunk.token_ids) for chunk in chunks)
    if not generated:
        return b"", list(chunks)
    rows = prompt_tokens - 1 + generated
    if len(packed) != rows * row_bytes:
        raise RuntimeError(f"{engine} returned routed experts for {len(packed) / row_bytes:g} positions; "
                           f"{prompt_tokens} prompt and {generated} output tokens need {rows}")
    cut = (prompt_tokens - 1) * row_bytes
    routed = []
    for chunk in chunks:
        end = cut + len(chunk.token_ids) * row_bytes
        routed.append(replace(chunk, routed_experts=packed[cut:end]))
        cut = end
    return packed[: (prompt_tokens - 1) * row_bytes], routed
