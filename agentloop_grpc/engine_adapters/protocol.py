"""The EngineAdapter protocol: what an engine must offer to be served over agentloop.v1.

One adapter instance is one engine (one data-parallel group). What every engine shares is written once, in
``lifecycle.py``: the state (loading, running, paused, asleep, draining), the resources Sleep released, the weight
version, the admission gate of Pause, the in-flight registry and the rules between them. The servicer validates
requests before they get here. An adapter keeps only what is its engine's: generating and aborting, freezing and
thawing for Pause(KEEP), releasing and restoring memory, applying weights and flushing its cache.

Adapters raise the exceptions in ``common/errors.py``; anything else is treated as an engine bug (INTERNAL).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from agentloop_grpc.common.types import GenerateEvent, GenerateRequest, LoadInfo, NamedTensor, Resource, ServerFacts


class EngineAdapter(Protocol):
    """An engine behind one gRPC server."""

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        """Load the model and start scheduling; return the engine's facts. Tokens are stamped with
        ``weight_version()`` read when they are produced (the lifecycle owns the version)."""
        ...

    async def shutdown(self) -> None:
        """Abort what is left and release the engine. Called once, after the server stopped."""
        ...

    def load(self) -> LoadInfo:
        """Snapshot of the engine's load (cheap: routers poll it); requests held at Pause's gate are the
        lifecycle's and are not counted here."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Yield TokenChunks, then exactly one GenerateComplete.

        Closing the iterator early (client gone) must not leave the request running; the lifecycle also calls
        ``abort`` in that case.
        """
        ...

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Abort the named requests: each stream ends with a FINISH_REASON_ABORT completion. Unknown ids are
        ignored (a request may have finished meanwhile)."""
        ...

    async def freeze(self) -> None:
        """Pause(KEEP): stop scheduling; requests keep their state and continue token-exactly on ``thaw``."""
        ...

    async def thaw(self) -> None:
        """Undo ``freeze``."""
        ...

    async def release(self, resources: frozenset[Resource]) -> None:
        """Sleep: release ``resources`` (nothing is in flight). Whether memory is really freed is the fact
        ``ServerFacts.sleep_releases_memory``."""
        ...

    async def restore(self, resources: frozenset[Resource]) -> None:
        """WakeUp: restore ``resources`` (each was released)."""
        ...

    async def update_weights(self, tensors: Sequence[NamedTensor], weight_version: int, flush_cache: bool) -> None:
        """Apply all ``tensors`` atomically (the lifecycle checked the version and that the weights are loaded)."""
        ...

    async def flush_cache(self) -> None:
        """Drop the prefix cache."""
        ...
