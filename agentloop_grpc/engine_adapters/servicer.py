"""EngineServicer: serves any EngineAdapter as agentloop.v1 TokenGenerate and EngineControl.

A thin layer between the wire and ``lifecycle.py`` (which owns the state, the gate, the in-flight registry and the
one Generate path, aborting a request whose caller went away): it validates requests before the adapter sees them
(``convert.py``, ``validation.py``), groups tokens into fewer messages when the caller's StreamOptions ask for it
(``grouping.py``) and keeps the standard health service in step with the engine's state. Every completion
carries the engine's load as GetLoad would answer it then, for every adapter alike, so a router that hears from a
server need not poll it. Errors are EngineError subclasses, mapped to status codes in ``serving/status.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import ALL_RESOURCES, GenerateComplete, GenerateRequest, TokenChunk
from agentloop_grpc.serving.status import map_errors
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from . import convert, validation
from .grouping import TokenGrouper, merge_chunks
from .lifecycle import EngineLifecycle
from .weights import read_weight_stream

log = logging.getLogger(__name__)

# a method's grpc.aio context, typed by its request and response messages
Context = grpc.aio.ServicerContext

SERVICE_NAMES = (
    generation_pb2.DESCRIPTOR.services_by_name["TokenGenerate"].full_name,
    engine_pb2.DESCRIPTOR.services_by_name["EngineControl"].full_name,
)


class EngineServicer(generation_pb2_grpc.TokenGenerateServicer, engine_pb2_grpc.EngineControlServicer):
    """TokenGenerate + EngineControl over one engine's lifecycle; publishes health through ``health``."""

    def __init__(self, lifecycle: EngineLifecycle, health: health_aio.HealthServicer) -> None:
        self.lifecycle = lifecycle
        self._health = health

    async def sync_health(self) -> None:
        """Publish SERVING while the engine accepts Generate (running or paused), NOT_SERVING otherwise."""
        serving = self.lifecycle.serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    async def begin_drain(self) -> None:
        """Refuse new Generate calls (UNAVAILABLE) and report NOT_SERVING; in-flight calls go on."""
        await self.lifecycle.begin_drain()
        await self.sync_health()

    def _state(self) -> engine_pb2.EngineState.ValueType:
        return convert.ENGINE_STATES[self.lifecycle.state]

    # -- TokenGenerate ---------------------------------------------------------------------------------------

    async def _request(self, request: generation_pb2.GenerateRequest) -> GenerateRequest:
        """The validated domain request (UNAVAILABLE first when the engine does not serve)."""
        facts = self.lifecycle.serving_facts()
        validation.check_id("session_id", request.session_id)
        if request.media:  # decoding images takes milliseconds to seconds: other calls go on meanwhile
            return await asyncio.to_thread(convert.request_from_proto, request, facts)
        return convert.request_from_proto(request, facts)

    async def _run(
        self,
        domain: GenerateRequest,
        grouper: TokenGrouper | None,
        on_chunk: Callable[[TokenChunk], Awaitable[None]],
        on_complete: Callable[[GenerateComplete, TokenChunk | None], Awaitable[None]],
    ) -> None:
        """Run ``domain`` through the lifecycle, handing its chunks to ``on_chunk`` as ``grouper`` groups them,
        then its completion and the tokens still held (``grouper.tail()``) to ``on_complete``: Generate writes
        each as a message of its stream."""
        events = self.lifecycle.generate(domain)
        try:
            async for event in events:
                if isinstance(event, GenerateComplete):
                    await on_complete(event, grouper.tail() if grouper else None)
                elif grouper is None:
                    await on_chunk(event)
                else:
                    for ready in grouper.add(event):
                        await on_chunk(ready)
        finally:
            await events.aclose()  # a client gone mid-stream: the lifecycle aborts its request now, not at GC

    # it streams by context.write, which grpc.aio allows; the generated servicer types only the iterator form
    @map_errors
    async def Generate(  # type: ignore[override]
        self,
        request: generation_pb2.GenerateRequest,
        context: Context[generation_pb2.GenerateRequest, generation_pb2.GenerateResponse],
    ) -> None:
        grouper = convert.grouper_from_proto(request)

        async def send_chunk(chunk: TokenChunk) -> None:
            await context.write(convert.chunk_to_proto(chunk))

        async def send_complete(complete: GenerateComplete, tail: TokenChunk | None) -> None:
            await context.write(convert.complete_to_proto(complete, tail, self.lifecycle.load()))

        await self._run(await self._request(request), grouper, send_chunk, send_complete)

    @map_errors
    async def GenerateUnary(
        self,
        request: generation_pb2.GenerateUnaryRequest,
        context: Context[generation_pb2.GenerateUnaryRequest, generation_pb2.GenerateUnaryResponse],
    ) -> generation_pb2.GenerateUnaryResponse:
        if not request.HasField("request"):
            raise InvalidRequestError("GenerateUnaryRequest.request is required")
        if request.request.HasField("stream_options"):
            raise InvalidRequestError(
                "request.stream_options shapes a Generate stream; GenerateUnary answers in one message: leave it unset"
            )
        domain = await self._request(request.request)
        # every token is held to the end (no grouper: nothing is sent before it), then merged into one chunk per
        # weight version: the last travels in the completion, the others before it
        chunks: list[TokenChunk] = []
        events = self.lifecycle.generate(domain)
        try:
            async for event in events:
                if isinstance(event, GenerateComplete):
                    response = generation_pb2.GenerateUnaryResponse()
                    merged = merge_chunks(chunks)
                    for chunk in merged[:-1]:
                        convert.fill_token_chunk(response.chunks.add(), chunk)
                    convert.fill_complete(response.complete, event, merged[-1] if merged else None,
                                          self.lifecycle.load())
                    return response
                chunks.append(event)
        finally:
            await events.aclose()  # a client gone: the lifecycle aborts its request now, not at GC
        raise RuntimeError(f"the engine ended request {domain.request_id!r} without a completion")

    @map_errors
    async def Abort(
        self,
        request: generation_pb2.AbortRequest,
        context: Context[generation_pb2.AbortRequest, generation_pb2.AbortResponse],
    ) -> generation_pb2.AbortResponse:
        if not request.all and not request.request_ids:
            raise InvalidRequestError("Abort needs request_ids or all = true")
        for index, request_id in enumerate(request.request_ids):
            validation.check_id(f"request_ids[{index}]", request_id)
        aborted = await self.lifecycle.abort(None if request.all else list(request.request_ids))
        return generation_pb2.AbortResponse(aborted_request_ids=aborted)

    @map_errors
    async def GetLoad(
        self,
        request: generation_pb2.GetLoadRequest,
        context: Context[generation_pb2.GetLoadRequest, generation_pb2.GetLoadResponse],
    ) -> generation_pb2.GetLoadResponse:
        return convert.load_to_proto(self.lifecycle.load())

    @map_errors
    async def EndSessions(
        self,
        request: generation_pb2.EndSessionsRequest,
        context: Context[generation_pb2.EndSessionsRequest, generation_pb2.EndSessionsResponse],
    ) -> generation_pb2.EndSessionsResponse:
        validation.check_session_ids(request.session_ids)
        demoted = await self.lifecycle.end_sessions(request.session_ids)
        return generation_pb2.EndSessionsResponse(demoted_blocks=demoted)

    # -- EngineControl ---------------------------------------------------------------------------------------

    @map_errors
    async def GetServerInfo(
        self,
        request: engine_pb2.GetServerInfoRequest,
        context: Context[engine_pb2.GetServerInfoRequest, engine_pb2.GetServerInfoResponse],
    ) -> engine_pb2.GetServerInfoResponse:
        lifecycle = self.lifecycle
        return convert.info_to_proto(lifecycle.facts, lifecycle.state, lifecycle.weight_version)

    @map_errors
    async def Sleep(
        self,
        request: engine_pb2.SleepRequest,
        context: Context[engine_pb2.SleepRequest, engine_pb2.SleepResponse],
    ) -> engine_pb2.SleepResponse:
        if request.level not in convert.SLEEP_LEVELS:
            raise InvalidRequestError("Sleep.level must be SLEEP_LEVEL_KV_CACHE or SLEEP_LEVEL_KV_CACHE_AND_WEIGHTS")
        released = await self.lifecycle.sleep(convert.SLEEP_LEVELS[request.level])
        await self.sync_health()
        return engine_pb2.SleepResponse(state=self._state(), memory_released=released)

    @map_errors
    async def WakeUp(
        self,
        request: engine_pb2.WakeUpRequest,
        context: Context[engine_pb2.WakeUpRequest, engine_pb2.WakeUpResponse],
    ) -> engine_pb2.WakeUpResponse:
        if any(tag not in convert.WAKE_UP_TAGS for tag in request.tags):
            raise InvalidRequestError("WakeUp.tags must be WAKE_UP_TAG_WEIGHTS or WAKE_UP_TAG_KV_CACHE")
        resources = frozenset(convert.WAKE_UP_TAGS[t] for t in request.tags) or ALL_RESOURCES
        await self.lifecycle.wake_up(resources)
        await self.sync_health()
        return engine_pb2.WakeUpResponse(state=self._state())

    @map_errors
    async def Pause(
        self,
        request: engine_pb2.PauseRequest,
        context: Context[engine_pb2.PauseRequest, engine_pb2.PauseResponse],
    ) -> engine_pb2.PauseResponse:
        if request.mode not in convert.PAUSE_MODES:
            raise InvalidRequestError("Pause.mode must be PAUSE_MODE_ABORT, PAUSE_MODE_KEEP or PAUSE_MODE_WAIT")
        result = await self.lifecycle.pause(convert.PAUSE_MODES[request.mode])
        return engine_pb2.PauseResponse(
            aborted_requests=result.aborted_requests, kept_requests=result.kept_requests, state=self._state()
        )

    @map_errors
    async def Resume(
        self,
        request: engine_pb2.ResumeRequest,
        context: Context[engine_pb2.ResumeRequest, engine_pb2.ResumeResponse],
    ) -> engine_pb2.ResumeResponse:
        await self.lifecycle.resume()
        return engine_pb2.ResumeResponse(state=self._state())

    @map_errors
    async def UpdateWeights(
        self,
        request_iterator: AsyncIterator[engine_pb2.UpdateWeightsRequest],
        context: Context[engine_pb2.UpdateWeightsRequest, engine_pb2.UpdateWeightsResponse],
    ) -> engine_pb2.UpdateWeightsResponse:
        tensors, commit, received = await read_weight_stream(request_iterator)
        version = commit.weight_version if commit.HasField("weight_version") else None
        result = await self.lifecycle.update_weights(tensors, version, commit.flush_cache)
        log.info("weights updated to version %d (%d tensors, %d bytes)", result.weight_version, len(tensors), received)
        return engine_pb2.UpdateWeightsResponse(
            weight_version=result.weight_version, tensors_updated=result.tensors_updated, bytes_received=received
        )

    @map_errors
    async def LoadWeights(
        self,
        request: engine_pb2.LoadWeightsRequest,
        context: Context[engine_pb2.LoadWeightsRequest, engine_pb2.LoadWeightsResponse],
    ) -> engine_pb2.LoadWeightsResponse:
        version = request.weight_version if request.HasField("weight_version") else None
        result, read = await self.lifecycle.load_weights(request.path, version, request.flush_cache)
        log.info("weights loaded from %s as version %d (%d tensors, %d bytes)", request.path, result.weight_version,
                 result.tensors_updated, read)
        return engine_pb2.LoadWeightsResponse(
            weight_version=result.weight_version, tensors_updated=result.tensors_updated, bytes_read=read
        )

    @map_errors
    async def JoinWeightGroup(
        self,
        request: engine_pb2.JoinWeightGroupRequest,
        context: Context[engine_pb2.JoinWeightGroupRequest, engine_pb2.JoinWeightGroupResponse],
    ) -> engine_pb2.JoinWeightGroupResponse:
        group = convert.weight_group_from_proto(request)
        ranks = await self.lifecycle.join_weight_group(group)
        log.info("joined weight group %r at %s:%d as ranks %s of %d (%s)", group.name, group.master_address,
                 group.master_port, ranks, group.world_size, group.backend)
        return engine_pb2.JoinWeightGroupResponse(ranks=ranks)

    @map_errors
    async def ReceiveWeights(
        self,
        request: engine_pb2.ReceiveWeightsRequest,
        context: Context[engine_pb2.ReceiveWeightsRequest, engine_pb2.ReceiveWeightsResponse],
    ) -> engine_pb2.ReceiveWeightsResponse:
        layout = convert.layout_from_proto(request)
        version = request.weight_version if request.HasField("weight_version") else None
        result = await self.lifecycle.receive_weights(request.group_name, layout, version, request.flush_cache)
        log.info("weights received over group %r as version %d (%d tensors, %d bytes)", request.group_name,
                 result.weight_version, result.tensors_updated, layout.total_bytes)
        return engine_pb2.ReceiveWeightsResponse(
            weight_version=result.weight_version, tensors_updated=result.tensors_updated,
            bytes_received=layout.total_bytes,
        )

    @map_errors
    async def LeaveWeightGroup(
        self,
        request: engine_pb2.LeaveWeightGroupRequest,
        context: Context[engine_pb2.LeaveWeightGroupRequest, engine_pb2.LeaveWeightGroupResponse],
    ) -> engine_pb2.LeaveWeightGroupResponse:
        await self.lifecycle.leave_weight_group(request.group_name)
        return engine_pb2.LeaveWeightGroupResponse()

    @map_errors
    async def FlushCache(
        self,
        request: engine_pb2.FlushCacheRequest,
        context: Context[engine_pb2.FlushCacheRequest, engine_pb2.FlushCacheResponse],
    ) -> engine_pb2.FlushCacheResponse:
        await self.lifecycle.flush_cache()
        return engine_pb2.FlushCacheResponse()
