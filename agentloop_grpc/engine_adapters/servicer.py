"""EngineServicer: serves any EngineAdapter as agentloop.v1 TokenGenerate and EngineControl.

It owns what every engine shares: validation (before the adapter sees a request), grouping tokens into fewer
messages when the caller's StreamOptions ask for it (``grouping.py``), request-id bookkeeping (duplicates in
flight are refused), state checks (no Generate while loading, asleep or draining), aborting the engine request
when the client goes away, and keeping the standard health service in step with the engine's state. Errors are
raised as EngineError subclasses and mapped to status codes in ``status.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from grpc_health.v1 import health_pb2

from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from . import convert, validation
from agentloop_grpc.common.errors import DuplicateRequestError, EngineUnavailableError, FailedPreconditionError, InvalidRequestError
from .protocol import EngineAdapter
from .sampling_cache import SamplingCache
from agentloop_grpc.serving.status import map_errors
from .grouping import TokenGrouper
from agentloop_grpc.common.types import ALL_RESOURCES, EngineState, GenerateComplete, GenerateRequest, TokenChunk
from .weights import read_weight_stream

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    generation_pb2.DESCRIPTOR.services_by_name["TokenGenerate"].full_name,
    engine_pb2.DESCRIPTOR.services_by_name["EngineControl"].full_name,
)
_NOT_SERVING_STATES = {EngineState.LOADING: "loading", EngineState.SLEEPING: "asleep", EngineState.DRAINING: "draining"}


class EngineServicer(generation_pb2_grpc.TokenGenerateServicer, engine_pb2_grpc.EngineControlServicer):
    """TokenGenerate + EngineControl over one adapter; publishes health through ``health``."""

    def __init__(self, adapter: EngineAdapter, health) -> None:
        self._adapter = adapter
        self._health = health
        self._in_flight: set[str] = set()
        self._sampling = SamplingCache()
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False

    # -- state and health ------------------------------------------------------------------------------------

    def state(self, engine_state: EngineState | None = None) -> EngineState:
        """The served state: DRAINING once a drain began, else the engine's (``engine_state`` if already read)."""
        if self._draining:
            return EngineState.DRAINING
        return engine_state if engine_state is not None else self._adapter.info().state

    async def sync_health(self) -> None:
        """Publish SERVING while the engine accepts Generate (running or paused), NOT_SERVING otherwise."""
        serving = self.state() not in _NOT_SERVING_STATES
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    async def begin_drain(self) -> None:
        """Refuse new Generate calls (UNAVAILABLE) and report NOT_SERVING; in-flight calls go on."""
        self._draining = True
        await self.sync_health()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no Generate is in flight; return False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _check_serving(self, engine_state: EngineState | None = None) -> None:
        state = self.state(engine_state)
        if state in _NOT_SERVING_STATES:
            raise EngineUnavailableError(f"the engine is {_NOT_SERVING_STATES[state]}; retry on another server")

    # -- TokenGenerate ---------------------------------------------------------------------------------------

    def _admit(self, request: generation_pb2.GenerateRequest) -> GenerateRequest:
        """Check the state and the request, and register its id (``_run`` releases it)."""
        info = self._adapter.info()
        self._check_serving(info.state)
        validation.check_id("session_id", request.session_id)
        domain = convert.request_from_proto(request, info, self._sampling)
        if domain.request_id in self._in_flight:
            quoted = validation.quote(domain.request_id)
            raise DuplicateRequestError(f"request_id {quoted} is already in flight on this server")
        self._in_flight.add(domain.request_id)
        self._idle.clear()
        return domain

    async def _run(
        self,
        domain: GenerateRequest,
        grouper: TokenGrouper | None,
        on_chunk: Callable[[TokenChunk], Awaitable[None]],
        on_complete: Callable[[GenerateComplete, TokenChunk | None], Awaitable[None]],
    ) -> None:
        """Run an admitted request, handing its chunks to ``on_chunk`` as ``grouper`` groups them, then its
        completion and the tokens still held (``grouper.tail()``) to ``on_complete``; release it however it ends.

        Generate writes each as a message of its stream; GenerateUnary fills its one answer in place."""
        finished = False
        try:
            async with contextlib.aclosing(self._adapter.generate(domain)) as events:
                async for event in events:
                    if isinstance(event, GenerateComplete):
                        finished = True
                        await on_complete(event, grouper.tail() if grouper else None)
                        break
                    if grouper is None:
                        await on_chunk(event)
                        continue
                    for ready in grouper.add(event):
                        await on_chunk(ready)
        finally:
            self._in_flight.discard(domain.request_id)
            if not self._in_flight:
                self._idle.set()
            if not finished:  # client cancelled, deadline passed, or the adapter failed: free the engine
                await self._adapter.abort([domain.request_id])
        if not finished:
            raise RuntimeError(f"the adapter ended request {domain.request_id!r} without a completion")

    @map_errors
    async def Generate(self, request, context):
        grouper = convert.grouper_from_proto(request)

        async def send_chunk(chunk: TokenChunk) -> None:
            await context.write(convert.chunk_to_proto(chunk))

        async def send_complete(complete: GenerateComplete, tail: TokenChunk | None) -> None:
            await context.write(convert.complete_to_proto(complete, tail))

        await self._run(self._admit(request), grouper, send_chunk, send_complete)

    @map_errors
    async def GenerateUnary(self, request, context):
        if not request.HasField("request"):
            raise InvalidRequestError("GenerateUnaryRequest.request is required")
        if request.request.HasField("stream_options"):
            raise InvalidRequestError(
                "request.stream_options shapes a Generate stream; GenerateUnary answers in one message: leave it unset"
            )
        response = generation_pb2.GenerateUnaryResponse()

        async def add_chunk(chunk: TokenChunk) -> None:
            convert.fill_token_chunk(response.chunks.add(), chunk)

        async def set_complete(complete: GenerateComplete, tail: TokenChunk | None) -> None:
            convert.fill_complete(response.complete, complete, tail)

        # final_only holds every token; a chunk is cut only where the weight version changes
        await self._run(self._admit(request.request), TokenGrouper(0, final_only=True), add_chunk, set_complete)
        return response

    @map_errors
    async def Abort(self, request, context):
        if not request.all and not request.request_ids:
            raise InvalidRequestError("Abort needs request_ids or all = true")
        for index, request_id in enumerate(request.request_ids):
            validation.check_id(f"request_ids[{index}]", request_id)
        aborted = await self._adapter.abort(None if request.all else list(request.request_ids))
        return generation_pb2.AbortResponse(aborted_request_ids=aborted)

    @map_errors
    async def GetLoad(self, request, context):
        return convert.load_to_proto(self._adapter.load())

    # -- EngineControl ---------------------------------------------------------------------------------------

    @map_errors
    async def GetServerInfo(self, request, context):
        response = convert.info_to_proto(self._adapter.info())
        response.state = convert.ENGINE_STATES[self.state()]
        return response

    @map_errors
    async def Sleep(self, request, context):
        if request.level not in convert.SLEEP_LEVELS:
            raise InvalidRequestError("Sleep.level must be SLEEP_LEVEL_KV_CACHE or SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS")
        if self._in_flight:
            raise FailedPreconditionError(
                f"{len(self._in_flight)} requests are in flight; Pause(PAUSE_MODE_ABORT) or let them finish first"
            )
        released = await self._adapter.sleep(convert.SLEEP_LEVELS[request.level])
        await self.sync_health()
        return engine_pb2.SleepResponse(state=convert.ENGINE_STATES[self.state()], memory_released=released)

    @map_errors
    async def WakeUp(self, request, context):
        if any(tag not in convert.WAKE_UP_TAGS for tag in request.tags):
            raise InvalidRequestError("WakeUp.tags must be WAKE_UP_TAG_WEIGHTS or WAKE_UP_TAG_KV_CACHE")
        resources = frozenset(convert.WAKE_UP_TAGS[t] for t in request.tags) or ALL_RESOURCES
        await self._adapter.wake_up(resources)
        await self.sync_health()
        return engine_pb2.WakeUpResponse(state=convert.ENGINE_STATES[self.state()])

    @map_errors
    async def Pause(self, request, context):
        if request.mode not in convert.PAUSE_MODES:
            raise InvalidRequestError("Pause.mode must be PAUSE_MODE_ABORT, PAUSE_MODE_KEEP or PAUSE_MODE_WAIT")
        self._check_serving()
        result = await self._adapter.pause(convert.PAUSE_MODES[request.mode])
        return engine_pb2.PauseResponse(
            aborted_requests=result.aborted_requests,
            kept_requests=result.kept_requests,
            state=convert.ENGINE_STATES[self.state()],
        )

    @map_errors
    async def Resume(self, request, context):
        await self._adapter.resume()
        return engine_pb2.ResumeResponse(state=convert.ENGINE_STATES[self.state()])

    @map_errors
    async def UpdateWeights(self, request_iterator, context):
        tensors, commit, received = await read_weight_stream(request_iterator)
        current = self._adapter.info().weight_version
        version = commit.weight_version if commit.HasField("weight_version") else current + 1
        if version <= current:
            raise FailedPreconditionError(f"weight_version {version} must be greater than the current {current}")
        result = await self._adapter.update_weights(tensors, version, commit.flush_cache)
        log.info("weights updated to version %d (%d tensors, %d bytes)", version, len(tensors), received)
        return engine_pb2.UpdateWeightsResponse(
            weight_version=result.weight_version, tensors_updated=result.tensors_updated, bytes_received=received
        )

    @map_errors
    async def FlushCache(self, request, context):
        await self._adapter.flush_cache()
        return engine_pb2.FlushCacheResponse()

