"""The EngineAdapter protocol: what an engine must offer to be served over agentloop.v1.

One adapter instance is one engine (one data-parallel group). What every engine shares is written once, in
``lifecycle.py``: the state (loading, running, paused, asleep, draining), the resources Sleep released, the weight
version, the admission gate of Pause, the in-flight registry and the rules between them. The servicer validates
requests before they get here. An adapter keeps only what is its engine's: generating and aborting, freezing and
thawing for Pause(KEEP), releasing and restoring memory, applying weights (streamed, or broadcast over a
weight-transfer group its workers join) and flushing its cache.

Adapters raise the exceptions in ``common/errors.py``; anything else is treated as an engine bug (INTERNAL).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from agentloop_grpc.common.errors import EngineError
from agentloop_grpc.common.types import GenerateEvent, GenerateRequest, LoadInfo, NamedTensor, Resource, ServerFacts
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupSpec


class EngineAdapter(Protocol):
    """An engine behind one gRPC server."""

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        """Load the model and start scheduling; return the engine's facts. Tokens are stamped with
        ``weight_version()`` read when they are produced (the lifecycle owns the version)."""
        ...

    async def shutdown(self) -> None:
        """Abort what is left and release the engine. Called once, after the server stopped; also after a
        ``start`` that failed or was cancelled (release what it made)."""
        ...

    def load(self) -> LoadInfo:
        """Snapshot of the engine's load (cheap: routers poll it); requests held at Pause's gate are the
        lifecycle's and are not counted here."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        """Yield TokenChunks, then exactly one GenerateComplete.

        An async generator: the lifecycle closes it (``aclose``) when the client goes, and that must not leave the
        request running; the lifecycle also calls ``abort`` in that case.
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

    async def load_weights(self, path: str, weight_version: int, flush_cache: bool) -> tuple[int, int]:
        """LoadWeights: apply the safetensors checkpoint at ``path`` (a file or a folder of them) as
        ``update_weights`` does, read where the engine's model lives; return (tensors applied, bytes read).
        InvalidRequestError naming the path or the tensor; nothing applied on failure."""
        ...

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        """Have each worker join ``group`` (ranks from ``group.rank_offset`` on; the lifecycle checked the spec
        against ``ServerFacts.weight_group_ranks``); return the ranks. EngineUnavailableError, naming the
        address, when the group does not form."""
        ...

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int, flush_cache: bool, refusal: EngineError | None
    ) -> None:
        """Vote in ``group`` on the announced update (no if ``refusal`` is set or a tensor does not fit the
        model), then receive it while generating and swap it in between two steps. Raise ``refusal``, the
        adapter's own refusal, or FailedPreconditionError when another member refused (nothing was received)."""
        ...

    async def leave_weight_group(self, group: str) -> None:
        """Leave ``group`` (joined before)."""
        ...

    async def flush_cache(self) -> None:
        """Drop the prefix cache."""
        ...

    async def end_sessions(self, session_ids: Sequence[str]) -> int:
        """EndSessions: the trajectories ``session_ids`` (GenerateRequest.session_id; distinct, validated) ended, so
        the prefix-cache blocks their last requests left may be evicted before any other. Blocks another live
        session or a running request still uses stay where they are. Return the number of blocks moved to the
        evict-first end; an engine that cannot reorder its cache returns 0 (its docstring says so). Unknown ids
        are ignored. Cheap: it waits at most for the engine's current step to end."""
        ...
