"""EngineLifecycle: what every engine shares between its requests and its control calls, written once.

It owns the state ladder (LOADING, RUNNING, PAUSED, SLEEPING, DRAINING), the resources Sleep released, the
weight version, the admission gate of Pause (new requests wait at it: they are not refused), the in-flight
registry (one entry per request id: a duplicate is refused) and the rules between them: no Generate while
loading, asleep or draining; no Sleep while requests are in flight; no weight update while the weights are
released or to a version not above the current one. ``generate`` is the one admit -> run -> complete path (the
servicer translates it to protobuf) and the one owner of abort-on-exit. The adapter (``protocol.py``) only does its
engine's part.

Pause modes: ABORT aborts everything in flight; KEEP freezes the engine (its requests continue token-exactly on
Resume); WAIT lets the requests in the engine finish. In every mode requests that arrive meanwhile wait at the
gate until Resume.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from agentloop_grpc.common.errors import (
    DuplicateRequestError,
    EngineError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
)
from agentloop_grpc.common.types import (
    EngineState,
    FinishReason,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    PauseMode,
    PauseResult,
    Resource,
    ServerFacts,
    WeightUpdateResult,
)
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupSpec

from .protocol import EngineAdapter
from .validation import quote

#: What each Sleep level releases.
SLEEP_LEVELS = {1: frozenset({Resource.KV_CACHE}), 2: frozenset({Resource.KV_CACHE, Resource.WEIGHTS})}
T = TypeVar("T")
_NOT_SERVING = {EngineState.LOADING: "loading", EngineState.SLEEPING: "asleep", EngineState.DRAINING: "draining"}


@dataclass(slots=True)
class Admission:
    """One request between admission and its end (``generate``'s entry in the in-flight registry)."""

    request: GenerateRequest
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    in_engine: bool = False


class EngineLifecycle:
    """One engine's shared state and rules over its ``adapter`` (see the module docstring)."""

    def __init__(self, adapter: EngineAdapter) -> None:
        self.adapter = adapter
        self.facts: ServerFacts | None = None
        self.weight_version = 0
        self._released: frozenset[Resource] = frozenset()
        self._draining = False
        self._frozen = False  # Pause(KEEP) froze the engine
        self._gate = asyncio.Event()  # clear while paused or pausing
        self._gate.set()
        self._in_flight: dict[str, Admission] = {}
        self._in_engine = 0
        self._engine_idle = asyncio.Event()  # nothing past the gate (Pause(WAIT) waits for it)
        self._engine_idle.set()
        self._idle = asyncio.Event()  # nothing in flight (a drain waits for it)
        self._idle.set()
        self._weights = asyncio.Lock()  # weight updates, Sleep and WakeUp one at a time: each changes the weights
        self._groups: set[str] = set()  # weight-transfer groups joined

    # -- state -----------------------------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        if self._draining:
            return EngineState.DRAINING
        if self.facts is None:
            return EngineState.LOADING
        if self._released:
            return EngineState.SLEEPING
        return EngineState.RUNNING if self._gate.is_set() else EngineState.PAUSED

    @property
    def serving(self) -> bool:
        """Whether Generate is accepted (running or paused: a paused engine holds new requests)."""
        return self.state not in _NOT_SERVING

    def serving_facts(self) -> ServerFacts:
        """The facts requests are validated against; UNAVAILABLE while loading, asleep or draining."""
        state = self.state
        if state in _NOT_SERVING:
            raise EngineUnavailableError(f"the engine is {_NOT_SERVING[state]}; retry on another server")
        return self.facts  # type: ignore[return-value]  # not LOADING: set

    def _loaded(self) -> ServerFacts:
        if self.facts is None:
            raise EngineUnavailableError("the engine is loading; retry when it is serving")
        return self.facts

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def start(self) -> ServerFacts:
        self.facts = await self.adapter.start(self._current_weight_version)
        return self.facts

    def _current_weight_version(self) -> int:
        return self.weight_version

    async def shutdown(self) -> None:
        for group in list(self._groups):  # the trainer's next broadcast then fails at once instead of hanging
            await self.leave_weight_group(group)
        await self.adapter.shutdown()

    def load(self) -> LoadInfo:
        """The adapter's load, with the requests waiting at Pause's gate counted as waiting."""
        load = self.adapter.load()
        gated = self.in_flight - self._in_engine
        if not gated:
            return load
        return replace(load, waiting_requests=load.waiting_requests + gated)

    # -- requests --------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        """``request``'s chunks, then its completion (validated by the caller): the one Generate path, the
        servicer's and in-process callers'. It registers the request and waits at Pause's gate; however it ends,
        the entry is released and a request the engine has not finished is aborted there (client gone, deadline
        passed, adapter failed). The request leaves the registry before its completion is yielded, so a caller
        may stop reading there and reuse the id at once."""
        self.serving_facts()
        if request.request_id in self._in_flight:
            raise DuplicateRequestError(f"request_id {quote(request.request_id)} is already in flight on this server")
        admission = self._in_flight[request.request_id] = Admission(request)
        self._idle.clear()
        complete: GenerateComplete | None = None
        try:
            if not await self._passed_gate(admission):
                complete = self._aborted_at_gate(request)
            else:
                admission.in_engine = True
                self._in_engine += 1
                self._engine_idle.clear()
                async with contextlib.aclosing(self.adapter.generate(request)) as events:
                    async for event in events:
                        if isinstance(event, GenerateComplete):
                            complete = event
                            break
                        yield event
        finally:
            del self._in_flight[request.request_id]
            if admission.in_engine:
                self._in_engine -= 1
                if not self._in_engine:
                    self._engine_idle.set()
                if complete is None:
                    await self.adapter.abort([request.request_id])
            if not self._in_flight:
                self._idle.set()
        if complete is None:
            raise RuntimeError(f"the adapter ended request {request.request_id!r} without a completion")
        yield complete

    async def _passed_gate(self, admission: Admission) -> bool:
        """Wait while paused; False if the request was aborted meanwhile."""
        while not self._gate.is_set() and not admission.aborted.is_set():
            waits = {asyncio.ensure_future(self._gate.wait()), asyncio.ensure_future(admission.aborted.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        return not admission.aborted.is_set()

    def _aborted_at_gate(self, request: GenerateRequest) -> GenerateComplete:
        """The completion of a request aborted before it reached the engine."""
        return GenerateComplete(
            finish_reason=FinishReason.ABORT,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=0,
            weight_version=self.weight_version,
        )

    async def abort(self, request_ids: Sequence[str] | None) -> list[str]:
        """Abort the named requests in flight (None: all), at the gate or in the engine; return their ids."""
        if request_ids is None:
            admissions = list(self._in_flight.values())
        else:
            admissions = [self._in_flight[r] for r in dict.fromkeys(request_ids) if r in self._in_flight]
        for admission in admissions:
            admission.aborted.set()
        in_engine = [a.request.request_id for a in admissions if a.in_engine]
        if in_engine:
            await self.adapter.abort(in_engine)
        return [a.request.request_id for a in admissions]

    async def begin_drain(self) -> None:
        """Refuse new Generate calls from now on; in-flight calls go on."""
        self._draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; return False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- control ---------------------------------------------------------------------------------------------

    async def pause(self, mode: PauseMode) -> PauseResult:
        self.serving_facts()
        self._gate.clear()
        if mode is PauseMode.ABORT:
            return PauseResult(aborted_requests=len(await self.abort(None)))
        if mode is PauseMode.KEEP:
            if not self._frozen:
                await self.adapter.freeze()
                self._frozen = True
            return PauseResult(kept_requests=self.in_flight)
        if self._frozen:  # WAIT after KEEP: what the engine holds must run to finish
            await self.adapter.thaw()
            self._frozen = False
        try:
            await self._engine_idle.wait()
        except asyncio.CancelledError:
            await self.resume()
            raise
        return PauseResult()

    async def resume(self) -> None:
        if self._frozen:
            await self.adapter.thaw()
            self._frozen = False
        self._gate.set()

    async def sleep(self, level: int) -> bool:
        """Release what ``level`` names; return whether memory is really freed (an engine fact)."""
        facts = self._loaded()
        if self._in_flight:
            raise FailedPreconditionError(
                f"{self.in_flight} requests are in flight; Pause(PAUSE_MODE_ABORT) or let them finish first"
            )
        async with self._weights:
            releasing = SLEEP_LEVELS[level] - self._released
            if releasing:
                await self.adapter.release(releasing)
                self._released |= releasing
        return facts.sleep_releases_memory

    async def wake_up(self, resources: frozenset[Resource]) -> EngineState:
        async with self._weights:
            restoring = frozenset(resources) & self._released
            if restoring:
                await self.adapter.restore(restoring)
                self._released -= restoring
        return self.state

    async def update_weights(
        self, tensors: Sequence[NamedTensor], weight_version: int | None, flush_cache: bool
    ) -> WeightUpdateResult:
        """Apply ``tensors`` as ``weight_version`` (None: the current one + 1). Nothing needs to be paused: an
        adapter swaps the weights in between its steps, and tokens after the swap carry the new version."""
        version, _ = await self._apply_update(
            weight_version, lambda version, _refusal: self.adapter.update_weights(tensors, version, flush_cache)
        )
        return WeightUpdateResult(weight_version=version, tensors_updated=len(tensors))

    async def load_weights(
        self, path: str, weight_version: int | None, flush_cache: bool
    ) -> tuple[WeightUpdateResult, int]:
        """``update_weights`` with the tensors of the safetensors checkpoint at ``path``, read by the engine (its
        own loader where it has one); also the bytes read."""
        version, (updated, read) = await self._apply_update(
            weight_version, lambda version, _refusal: self.adapter.load_weights(path, version, flush_cache)
        )
        return WeightUpdateResult(weight_version=version, tensors_updated=updated), read

    async def _apply_update(
        self, requested: int | None, apply: Callable[[int, EngineError | None], Awaitable[T]], vote: bool = False
    ) -> tuple[int, T]:
        """The rules every weight update follows, once: loaded weights, one update (or Sleep, WakeUp) at a time,
        a version above the current one (None: the current + 1), the version set only once ``apply(version,
        refusal)`` succeeded. A refusal is raised before ``apply`` unless ``vote``: then ``apply`` gets it (a weight
        group votes on it, and the adapter raises it)."""
        self._loaded()
        async with self._weights:
            version = self.weight_version + 1 if requested is None else requested
            refusal = self._update_refusal(version)
            if refusal is not None and not vote:
                raise refusal
            result = await apply(version, refusal)
            self.weight_version = version
        return version, result

    def _update_refusal(self, version: int) -> EngineError | None:
        """Why an update to ``version`` cannot be applied now; None if it can."""
        if version <= self.weight_version:
            return FailedPreconditionError(
                f"weight_version {version} must be greater than the current {self.weight_version}"
            )
        if Resource.WEIGHTS in self._released:
            return EngineUnavailableError("the weights are released (asleep); WakeUp with WAKE_UP_TAG_WEIGHTS first")
        return None

    # -- weight-transfer groups ------------------------------------------------------------------------------

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        """Have the engine's workers join ``group``; return their ranks."""
        facts = self._loaded()
        if not facts.weight_group_ranks:
            raise FailedPreconditionError(
                f"the {facts.engine_kind} engine cannot join a weight group; use LoadWeights or UpdateWeights"
            )
        problem = group.problem(facts.weight_group_ranks)
        if problem is not None:
            raise InvalidRequestError(problem)
        if group.name in self._groups:
            raise FailedPreconditionError(f"this server is already in weight group {quote(group.name)}")
        self._groups.add(group.name)  # taken while joining: a second join of the name is refused
        try:
            ranks = await self.adapter.join_weight_group(group)
        except BaseException:
            self._groups.discard(group.name)
            raise
        return ranks

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int | None, flush_cache: bool
    ) -> WeightUpdateResult:
        """Take the update the group's leader broadcasts next and apply it as ``update_weights`` does. Refusals
        (version, released weights, tensors the model lacks) are voted in the group: nobody receives then."""
        self._loaded()
        if group not in self._groups:
            raise InvalidRequestError(f"group_name {quote(group)} is not a weight group this server joined")

        async def receive(version: int, refusal: EngineError | None) -> None:
            try:
                await self.adapter.receive_weights(group, layout, version, flush_cache, refusal)
            except (asyncio.CancelledError, EngineUnavailableError) as error:
                if error is not refusal:  # cut short or broken: a receive may still run; the trainer joins again
                    await asyncio.shield(self.leave_weight_group(group))
                raise

        version, _ = await self._apply_update(weight_version, receive, vote=True)
        return WeightUpdateResult(weight_version=version, tensors_updated=len(layout.specs))

    async def leave_weight_group(self, group: str) -> None:
        if group in self._groups:
            self._groups.discard(group)
            await self.adapter.leave_weight_group(group)

    async def flush_cache(self) -> None:
        self._loaded()
        await self.adapter.flush_cache()

    async def end_sessions(self, session_ids: Sequence[str]) -> int:
        """EndSessions: the adapter demotes what the ended sessions left in its prefix cache; the number of blocks
        demoted (0 while loading: nothing is cached yet)."""
        if self.facts is None:
            return 0
        return await self.adapter.end_sessions(list(dict.fromkeys(session_ids)))
