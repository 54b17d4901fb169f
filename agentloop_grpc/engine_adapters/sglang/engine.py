"""SglangEngine: the EngineAdapter of one DP group whose SGLang engine lives in a Ray actor (TP rank 0).

start() connects to Ray if needed, finds the group's TP actors (``discovery.py``), asks rank 0 to create
``sgl.Engine`` and keeps its facts; every later call goes to that actor. This adapter keeps what SGLang does not
know or what must be answered without a round trip: the weight version, what Sleep released, the pause gate,
the requests in flight (GetLoad counts them exactly and at once; KV usage comes from a background poll of
SGLang's load snapshot), and the prefix-cache hit rate from the cached-token counts SGLang reports per request.

- Generate: the request crosses Ray once; deltas stream back through the actor's streaming generator.
  Aborting (Abort, client gone, Pause(ABORT), drain) cancels that stream: the actor's ``finally`` calls SGLang's
  ``abort_request(rid)``, and the stream here ends with FINISH_REASON_ABORT and the tokens already delivered.
  Cancelling is race-free where ``abort_request`` is not (SGLang ignores a rid it has not registered yet).
- Pause: new requests wait at a gate here (they are not refused); ABORT aborts what runs, then
  ``pause_generation("abort")``; KEEP is ``pause_generation("in_place")`` (requests keep their KV and continue
  token-exactly on Resume); WAIT (no SGLang mode) waits until nothing runs, then pauses in place.
- Sleep: level 1 releases ``kv_cache``, level 2 ``kv_cache`` and ``weights`` (SGLang's supported tags). Memory is
  freed only if the engine runs with ``enable_memory_saver``; without it Sleep changes only the state and says so
  (``memory_released = False``, ``sleep_releases_memory = False``). WakeUp resumes weights before the KV cache.
- UpdateWeights: tensors go to the actor, which loads them with SGLang's update_weights_from_tensor; SGLang's
  refusal (e.g. an unknown parameter name) is INVALID_ARGUMENT with SGLang's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import ray

from agentloop_grpc.common.errors import EngineUnavailableError, FailedPreconditionError, InvalidRequestError
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
    ServerInfo,
    TokenChunk,
    WeightUpdateResult,
)
from .actor import PAUSE_ABORT, PAUSE_IN_PLACE
from .config import SglangEngineConfig
from .discovery import TpGroup, find_tp_group
from .facts import EngineFacts, EngineLoad
from .outputs import StreamEnd

log = logging.getLogger(__name__)

_SLEEP_TAGS = {1: frozenset({Resource.KV_CACHE}), 2: frozenset({Resource.KV_CACHE, Resource.WEIGHTS})}
_TAGS = {Resource.WEIGHTS: "weights", Resource.KV_CACHE: "kv_cache"}  # in the order WakeUp resumes them


def _tags(resources: frozenset[Resource]) -> list[str]:
    return [tag for resource, tag in _TAGS.items() if resource in resources]


@dataclass(slots=True)
class _InFlight:
    """One request between Generate and its completion."""

    request: GenerateRequest
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    stream: ray.ObjectRefGenerator | None = None  # None while held at the pause gate
    emitted: int = 0

    def abort(self) -> None:
        self.aborted.set()
        if self.stream is not None:
            # only the stream: Ray's default would also cancel every task the actor's generate had submitted, which
            # are not ours to stop (found when the stand-in's fire-and-forget call records vanished under load)
            ray.cancel(self.stream, recursive=False)


class SglangEngine:
    """The SGLang EngineAdapter (see module docstring)."""

    def __init__(self, config: SglangEngineConfig) -> None:
        self.config = config
        self._group: TpGroup | None = None
        self._facts: EngineFacts | None = None
        self._engine_load: EngineLoad | None = None
        self._poll_task: asyncio.Task | None = None
        self._weight_version = 0
        self._released: frozenset[Resource] = frozenset()
        self._paused = False
        self._gate = asyncio.Event()
        self._gate.set()
        self._in_flight: dict[str, _InFlight] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._prompt_tokens_seen = 0
        self._prompt_tokens_cached = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if not ray.is_initialized():
            ray.init(address=self.config.ray_address or "auto", log_to_driver=False)
        self._group = await find_tp_group(self.config)
        self._facts = await self._group.leader.start.remote()
        self._engine_load = await self._group.leader.load.remote()
        self._poll_task = asyncio.create_task(self._poll_load(), name="sglang-load-poll")

    async def shutdown(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
        await self.abort(None)
        if self._group is not None:
            with contextlib.suppress(ray.exceptions.RayActorError):
                await self._group.leader.shutdown.remote()

    async def _poll_load(self) -> None:
        while True:
            await asyncio.sleep(self.config.load_poll_s)
            try:
                self._engine_load = await self._leader().load.remote()
            except ray.exceptions.RayError as error:  # keep serving; GetLoad shows the last snapshot
                log.warning("polling SGLang's load failed: %s", error)

    def _leader(self) -> ray.actor.ActorHandle:
        if self._group is None:
            raise EngineUnavailableError("the SGLang engine is not started")
        return self._group.leader

    def _gone(self, error: Exception) -> EngineUnavailableError:
        return EngineUnavailableError(f"the SGLang rank-0 actor {self._group.names[0]!r} is gone: {error}")

    async def _call(self, method: str, *args):
        """Await one call on the rank-0 actor; a dead actor is UNAVAILABLE (retry on another server)."""
        try:
            return await getattr(self._leader(), method).remote(*args)
        except ray.exceptions.RayActorError as error:
            raise self._gone(error) from error

    # -- info and load ---------------------------------------------------------------------------------------

    def _state(self) -> EngineState:
        if self._facts is None:
            return EngineState.LOADING
        if self._released:
            return EngineState.SLEEPING
        return EngineState.PAUSED if self._paused else EngineState.RUNNING

    def info(self) -> ServerInfo:
        facts = self._facts
        return ServerInfo(
            engine_kind="sglang",
            engine_version=facts.engine_version if facts else "",
            model_id=self.config.model_id or (facts.model_path if facts else ""),
            tokenizer_fingerprint=facts.tokenizer_fingerprint if facts else "",
            vocab_size=facts.vocab_size if facts else 0,
            max_model_len=facts.context_len if facts else 0,
            eos_token_ids=facts.eos_token_ids if facts else (),
            weight_version=self._weight_version,
            state=self._state(),
            dp_rank=self.config.dp_rank,
            dp_size=self.config.dp_size,
            tp_size=self.config.tp_size,
            sleep_releases_memory=bool(facts and facts.memory_saver),
            supports_structured_output=True,
        )

    def load(self) -> LoadInfo:
        held = sum(1 for entry in self._in_flight.values() if entry.stream is None)
        snapshot = self._engine_load
        seen = self._prompt_tokens_seen
        return LoadInfo(
            running_requests=len(self._in_flight) - held,
            waiting_requests=held,
            kv_cache_usage=min(1.0, max(0.0, snapshot.kv_cache_usage)) if snapshot else 0.0,
            prefix_cache_hit_rate=self._prompt_tokens_cached / seen if seen else 0.0,
            max_running_requests=max(1, snapshot.max_running_requests) if snapshot else 1,
        )

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        if self._released:
            raise EngineUnavailableError("the SGLang engine is asleep")
        entry = _InFlight(request)
        self._in_flight[request.request_id] = entry
        end: StreamEnd | None = None
        try:
            if await self._passed_gate(entry):
                async for event in self._stream(entry):
                    if isinstance(event, StreamEnd):
                        end = event
                    else:
                        yield event
            if end is None:  # aborted: held at the gate, or its stream was cancelled
                end = StreamEnd(FinishReason.ABORT, prompt_tokens=len(request.prompt_ids), cached_tokens=0)
            else:  # SGLang's own counts feed the hit rate
                self._prompt_tokens_seen += end.prompt_tokens
                self._prompt_tokens_cached += end.cached_tokens
            yield GenerateComplete(
                finish_reason=end.reason,
                prompt_tokens=end.prompt_tokens,
                completion_tokens=entry.emitted,
                weight_version=self._weight_version,
                cached_prompt_tokens=end.cached_tokens,
                matched_stop_token_id=end.matched_stop_token_id,
            )
        finally:
            if end is None:
                entry.abort()
            del self._in_flight[request.request_id]
            if not any(e.stream is not None for e in self._in_flight.values()):
                self._idle.set()

    async def _passed_gate(self, entry: _InFlight) -> bool:
        """Wait while paused; False if the request was aborted meanwhile."""
        while not self._gate.is_set() and not entry.aborted.is_set():
            waits = {asyncio.ensure_future(self._gate.wait()), asyncio.ensure_future(entry.aborted.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        return not entry.aborted.is_set()

    async def _stream(self, entry: _InFlight) -> AsyncIterator[TokenChunk | StreamEnd]:
        """TokenChunks, then the StreamEnd; nothing more once the entry is aborted (the caller ends it)."""
        leader = self._leader()
        self._idle.clear()  # Pause(WAIT) waits for dispatched requests only, not for those held at the gate
        entry.stream = leader.generate.options(num_returns="streaming").remote(entry.request)
        try:
            async for ref in entry.stream:
                delta = await ref
                if entry.aborted.is_set():  # deltas already in flight when the abort landed are dropped
                    return
                end = delta.end
                if end is not None and end.rejected is not None and not entry.emitted:
                    raise InvalidRequestError(f"SGLang rejected the request: {end.rejected}")
                if delta.token_ids:
                    entry.emitted += len(delta.token_ids)
                    yield TokenChunk(delta.token_ids, self._weight_version, delta.logprobs, delta.top_logprobs)
                if end is not None:
                    yield end
                    return
        except ray.exceptions.TaskCancelledError:
            if not entry.aborted.is_set():
                raise
            return
        except ray.exceptions.RayActorError as error:
            raise self._gone(error) from error
        if not entry.aborted.is_set():
            raise RuntimeError(f"the SGLang actor ended request {entry.request.request_id!r} without a finish reason")

    async def abort(self, request_ids: Sequence[str] | None) -> list[str]:
        wanted = self._in_flight.keys() if request_ids is None else [r for r in request_ids if r in self._in_flight]
        aborted = list(wanted)
        for request_id in aborted:
            self._in_flight[request_id].abort()
        return aborted

    # -- control ---------------------------------------------------------------------------------------------

    async def sleep(self, level: int) -> bool:
        if self._in_flight:
            raise FailedPreconditionError(f"{len(self._in_flight)} requests are in flight")
        releasing = _SLEEP_TAGS[level] - self._released
        freed = bool(self._facts and self._facts.memory_saver)
        if freed and releasing:
            await self._call("release_memory", _tags(releasing))
        self._released |= releasing
        self._prompt_tokens_seen = self._prompt_tokens_cached = 0  # SGLang's prefix cache goes with the KV cache
        return freed

    async def wake_up(self, resources: frozenset[Resource]) -> EngineState:
        waking = self._released & resources
        if waking and self._facts is not None and self._facts.memory_saver:
            await self._call("resume_memory", _tags(waking))
        self._released -= waking
        return self._state()

    async def pause(self, mode: PauseMode) -> PauseResult:
        self._paused = True
        self._gate.clear()
        if mode is PauseMode.ABORT:
            aborted = await self.abort([rid for rid, e in self._in_flight.items() if e.stream is not None])
            await self._call("pause", PAUSE_ABORT)
            return PauseResult(aborted_requests=len(aborted))
        if mode is PauseMode.WAIT:
            try:
                await self._idle.wait()
            except asyncio.CancelledError:
                await self.resume()
                raise
        await self._call("pause", PAUSE_IN_PLACE)
        return PauseResult(kept_requests=len(self._in_flight) if mode is PauseMode.KEEP else 0)

    async def resume(self) -> None:
        if self._paused:
            await self._call("resume")
        self._paused = False
        self._gate.set()

    async def update_weights(
        self, tensors: Sequence[NamedTensor], weight_version: int, flush_cache: bool
    ) -> WeightUpdateResult:
        if Resource.WEIGHTS in self._released:
            raise EngineUnavailableError("the weights are released (asleep); WakeUp with WAKE_UP_TAG_WEIGHTS first")
        success, message = await self._call("update_weights", list(tensors), flush_cache, weight_version)
        if not success:
            raise InvalidRequestError(f"SGLang refused the weight update: {message}")
        self._weight_version = weight_version
        if flush_cache:
            self._prompt_tokens_seen = self._prompt_tokens_cached = 0
        return WeightUpdateResult(weight_version=weight_version, tensors_updated=len(tensors))

    async def flush_cache(self) -> None:
        if not await self._call("flush_cache"):
            raise FailedPreconditionError(
                "SGLang refused to flush the cache: requests are running (or kept by Pause(KEEP)); "
                "finish or abort them first"
            )
        self._prompt_tokens_seen = self._prompt_tokens_cached = 0
