"""Reading one request's event queue as a Generate stream, merging chunks a slow reader let pile up.

The queue carries TokenChunks, then one GenerateComplete; or an exception, when the engine failed the request
(it is raised to the reader, and the servicer reports it as an engine error).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agentloop_grpc.common.types import GenerateComplete, GenerateEvent, TokenChunk

Item = GenerateEvent | Exception


def _merge(chunks: list[TokenChunk]) -> TokenChunk:
    if len(chunks) == 1:
        return chunks[0]
    return TokenChunk(
        token_ids=tuple(t for c in chunks for t in c.token_ids),
        weight_version=chunks[-1].weight_version,
        logprobs=tuple(lp for c in chunks for lp in c.logprobs),
        top_logprobs=tuple(alt for c in chunks for alt in c.top_logprobs),
    )


async def stream(events: asyncio.Queue[Item]) -> AsyncIterator[GenerateEvent]:
    """Yield chunks (merged when several are queued; a weight-version change starts a new chunk), then the end."""
    while True:
        event = await events.get()
        if isinstance(event, Exception):
            raise event
        if isinstance(event, GenerateComplete):
            yield event
            return
        chunks = [event]
        complete = None
        while not events.empty():
            queued = events.get_nowait()
            if isinstance(queued, Exception):
                yield _merge(chunks)
                raise queued
            if isinstance(queued, GenerateComplete):
                complete = queued
                break
            if queued.weight_version != chunks[-1].weight_version:
                yield _merge(chunks)
                chunks = []
            chunks.append(queued)
        yield _merge(chunks)
        if complete is not None:
            yield complete
            return
