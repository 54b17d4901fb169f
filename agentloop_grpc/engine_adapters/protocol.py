"""The EngineAdapter protocol: what an engine must offer to be served over agentloop.v1.

One adapter instance is one engine (one data-parallel group). The servicer owns everything common to all engines
(validation, request-id bookkeeping, state checks before Generate, aborting a request whose client went away,
health status); an adapter owns scheduling, sampling and its engine's state.

Adapters raise the exceptions in ``errors.py``; anything else is treated as an engine bug (INTERNAL).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from agentloop_grpc.common.types import (
    EngineState,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    PauseMode,
    PauseResult,
    Resource,
    ServerInfo,
    WeightUpdateResult,
)


class EngineAdapter(Protocol):
    """An engine behind one gRPC server."""

    async def start(self) -> None:
        """Load the model and start scheduling; the state goes from LOADING to RUNNING."""
        ...

    async def shutdown(self) -> None:
        """Abort what is left and release the engine. Called once, after the server stopped."""
        ...

    def info(self) -> ServerInfo:
        """Describe the engine now (cheap: called before every Generate)."""
        ...

    def load(self) -> LoadInfo:
        """Snapshot of the engine's load (cheap: routers poll it)."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Yield TokenChunks, then exactly one GenerateComplete.

        Closing the iterator early (client gone) must not leave the request running; the servicer also calls
        ``abort`` in that case. While paused, a new request waits (it is not an error).
        """
        ...

    async def abort(self, request_ids: Sequence[str] | None) -> list[str]:
        """Abort the named requests (None: all). Return the ids that were in flight. Unknown ids are ignored."""
        ...

    async def sleep(self, level: int) -> bool:
        """Release resources (1: KV cache; 2: KV cache and weights). Return whether memory was really freed.

        Raise FailedPreconditionError while requests are in flight.
        """
        ...

    async def wake_up(self, resources: frozenset[Resource]) -> EngineState:
        """Restore released resources; return the state after (RUNNING once nothing is released)."""
        ...

    async def pause(self, mode: PauseMode) -> PauseResult:
        """Hold generation; ABORT aborts in-flight requests, KEEP holds them, WAIT returns once they finished."""
        ...

    async def resume(self) -> None:
        """Continue after pause."""
        ...

    async def update_weights(
        self, tensors: Sequence[NamedTensor], weight_version: int, flush_cache: bool
    ) -> WeightUpdateResult:
        """Apply all ``tensors`` atomically and set the weight version (validated > current by the servicer)."""
        ...

    async def flush_cache(self) -> None:
        """Drop the prefix cache."""
        ...
