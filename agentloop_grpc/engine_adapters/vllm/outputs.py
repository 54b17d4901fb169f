"""vLLM's streamed ``RequestOutput`` deltas -> our TokenChunk and GenerateComplete.

Token fidelity: the ids are the ones vLLM's sampler produced, in order, copied as they are (stop and
end-of-sequence ids included: vLLM keeps them in ``token_ids``; only its text leaves them out). Weight versions:
each chunk carries the version vLLM recorded for its tokens; a delta whose tokens span a weight swap is split.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.outputs import CompletionOutput

from agentloop_grpc.common.types import FinishReason, GenerateComplete, SamplingParams, TokenChunk

_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def token_chunk(output: CompletionOutput, sampling: SamplingParams, weight_version: int) -> TokenChunk | None:
    """The chunk of this delta (None when it carries no token, e.g. a bare abort)."""
    token_ids = tuple(output.token_ids)
    if not token_ids:
        return None
    if not sampling.logprobs:
        return TokenChunk(token_ids=token_ids, weight_version=weight_version)
    positions = output.logprobs
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(positions or ())} logprob positions for {len(token_ids)} tokens")
    logprobs = tuple(float(position[token].logprob) for token, position in zip(token_ids, positions))
    top: tuple[tuple[tuple[int, float], ...], ...] = ()
    if sampling.top_logprobs:
        # vLLM adds the sampled token to the k alternatives when it is not among them: keep the k best.
        top = tuple(
            tuple(
                sorted(((t, float(lp.logprob)) for t, lp in position.items()), key=lambda item: -item[1])[
                    : sampling.top_logprobs
                ]
            )
            for position in positions
        )
    return TokenChunk(token_ids=token_ids, weight_version=weight_version, logprobs=logprobs, top_logprobs=top)


def token_chunks(
    output: CompletionOutput, sampling: SamplingParams, first: int, version_starts: Sequence[tuple[int, int]]
) -> list[TokenChunk]:
    """The chunks of this delta, whose tokens are the request's output tokens from index ``first`` on: one per
    weight version they were sampled with. ``version_starts`` are vLLM's spans: (first token index, version)."""
    whole = token_chunk(output, sampling, 0)
    if whole is None:
        return []
    end = first + len(whole.token_ids)
    chunks = []
    covered = first
    for index, (start, version) in enumerate(version_starts):
        stop = version_starts[index + 1][0] if index + 1 < len(version_starts) else end
        lo, hi = max(start, first), min(stop, end)
        if lo < hi:
            if lo != covered:
                break
            chunks.append(_part(whole, lo - first, hi - first, version))
            covered = hi
    if covered != end:
        raise RuntimeError(f"vLLM recorded no weight version for output tokens {covered}..{end - 1}")
    return chunks


def _part(chunk: TokenChunk, lo: int, hi: int, weight_version: int) -> TokenChunk:
    return TokenChunk(
        token_ids=chunk.token_ids[lo:hi],
        weight_version=weight_version,
        logprobs=chunk.logprobs[lo:hi],
        top_logprobs=chunk.top_logprobs[lo:hi],
    )


def finish_reason(output: CompletionOutput) -> FinishReason:
    reason = _FINISH_REASONS.get(str(output.finish_reason))
    if reason is None:  # "error" (a request-level engine failure) or a reason this adapter does not know
        raise RuntimeError(f"vLLM ended the request with finish_reason {output.finish_reason!r}")
    return reason


def completion(
    output: CompletionOutput,
    reason: FinishReason,
    prompt_tokens: int,
    completion_tokens: int,
    cached_prompt_tokens: int,
    last_token: int | None,
    weight_version: int,
    prompt_images: int = 0,
) -> GenerateComplete:
    """The final message; the matched stop id is vLLM's stop_reason, or the end-of-sequence id it stopped on."""
    matched = None
    if reason is FinishReason.STOP:
        matched = output.stop_reason if isinstance(output.stop_reason, int) else last_token
    return GenerateComplete(
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        weight_version=weight_version,
        cached_prompt_tokens=cached_prompt_tokens,
        matched_stop_token_id=matched,
        prompt_images=prompt_images,
    )
