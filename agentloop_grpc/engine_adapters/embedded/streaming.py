"""Reading one request's event queue as a Generate stream, merging chunks a slow reader let pile up.

The queue carries TokenChunks, then one GenerateComplete; or an exception, when the engine failed the request
(it is raised to the reader, and the servicer reports it as an engine error).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agentloop_grpc.common.types import GenerateComplete, GenerateEvent, TokenChunk

from ..grouping import merge_chunks

Item = GenerateEvent | Exception


async def stream(events: asyncio.Queue[Item]) -> AsyncIterator[GenerateEvent]:
    """Yield chunks (those queued together merged, one per weight version), then the end."""
    while True:
        event: Item | None = await events.get()
        chunks: list[TokenChunk] = []
        while isinstance(event, TokenChunk):
            chunks.append(event)
            event = None if events.empty() else events.get_nowait()
        for chunk in merge_chunks(chunks):
            yield chunk
        if isinstance(event, Exception):
            raise event
        if isinstance(event, GenerateComplete):
            yield event
            return
