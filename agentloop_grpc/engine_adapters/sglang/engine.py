"""SglangEngine: the EngineAdapter of one DP group whose SGLang engine lives in a Ray actor (TP rank 0).

start() connects to Ray if needed, finds the group's TP actors (``discovery.py``), asks rank 0 to create
``sgl.Engine`` and keeps its facts; every later call goes to that actor (the state, Pause's gate and the weight
version are the lifecycle's, ``lifecycle.py``). This adapter keeps what must be answered without a round trip:
the requests in the engine (GetLoad counts them exactly and at once; KV usage comes from a background poll of
SGLang's load snapshot), and the prefix-cache hit rate from the cached-token counts SGLang reports per request.

- Generate: the request crosses Ray once; deltas stream back through the actor's streaming generator.
  Aborting (Abort, client gone, Pause(ABORT), drain) cancels that stream: the actor's ``finally`` calls SGLang's
  ``abort_request(rid)``, and the stream here ends with FINISH_REASON_ABORT and the tokens already delivered.
  Cancelling is race-free where ``abort_request`` is not (SGLang ignores a rid it has not registered yet).
- Pause(KEEP) is ``pause_generation("in_place")``: requests keep their KV and continue token-exactly on Resume.
- Sleep: level 1 releases ``kv_cache``, level 2 ``kv_cache`` and ``weights`` (SGLang's supported tags). Memory is
  freed only if the engine runs with ``enable_memory_saver``; without it Sleep changes only the state and says so
  (``memory_released = False``, ``sleep_releases_memory = False``). WakeUp resumes weights before the KV cache.
- UpdateWeights: tensors go to the actor, which loads them with SGLang's update_weights_from_tensor; SGLang's
  refusal (e.g. an unknown parameter name) is INVALID_ARGUMENT with SGLang's message.
- LoadWeights: SGLang reads the checkpoint itself (``update_weights_from_disk``, ``load_format="safetensors"``):
  the path is resolved on the rank-0 actor's machine, where SGLang's scheduler reads it, and only the headers are
  read there (for the checks every adapter makes and ``bytes_read``). SGLang loads model folders, so a file is
  handed over as a temporary folder linking to it (removed after the load, though SGLang then records it as its
  ``model_path``); a folder with a ``model.safetensors.index.json`` is loaded as
  SGLang does, only the files that index names. SGLang's refusal is INVALID_ARGUMENT with its message. SGLang's
  loader is not transactional (``ModelRunner.update_weights_from_disk`` rolls back by re-reading the path it was
  given), so a checkpoint SGLang refuses midway may leave some tensors loaded.
- Weight groups (JoinWeightGroup, ReceiveWeights, LeaveWeightGroup): the rank-0 actor's process is the one member
  of this DP group (``weight_group_ranks = 1``): it receives the broadcast with ``WeightGroupMember`` on a thread
  while generation goes on, then loads it with one ``update_weights_from_tensor`` call, which feeds every TP
  rank. SGLang's own groups cannot take the contract's layout: ``ModelRunner.init_weights_update_group`` makes
  every TP rank a member (rank ``rank_offset + tp_rank``) of a group formed by ``init_custom_process_group`` over
  a ``tcp://`` rendezvous of its own, and ``update_weights_from_distributed`` expects one broadcast per tensor (or,
  with ``load_format="flattened_bucket"``, one broadcast of the tensors packed without alignment), with no vote
  before the bytes and a partial load on failure; the tokenizer manager also asserts ``dp_size == 1``. Here one
  receive serves the whole DP group whatever its TP size, and one send of the trainer serves every DP group.
  SGLang judges names and shapes only when it loads, so such a refusal comes after the bytes were received (the
  group stays usable; in a group of several servers the others may have applied the update).
- Prefix cache and weights: every request carries SGLang's ``cache_salt`` (0.5.23: ``GenerateReqInput.cache_salt``,
  "cache namespace used to isolate otherwise-identical prefixes") naming the weight version it is submitted under
  (``block_hash.version_salt``). SGLang's radix tree keys each child by ``(extra_key, cache_salt)`` before the ids
  (``mem_cache/radix_cache.py``, ``RadixKey.child_key_at``), so a request never matches a node another version
  computed, and an update without flush_cache leaves the old nodes to age out first (nothing touches them again).
  Requests already in SGLang when an update lands keep their salt: a running one keeps its KV (as in every
  engine), a queued one may still match the old version's nodes. Nothing stricter is possible there: SGLang
  refuses to flush while any request runs or waits (``Scheduler.flush_cache``: ``is_fully_idle``; an update with
  flush_cache answers failure then, though the weights were applied).
- EndSessions answers 0: SGLang's radix cache has no call that demotes the nodes a request left (eviction follows
  the nodes' last access, or a priority fixed per request at submission: ``mem_cache/evict_policy.py``). Its
  session radix cache (``enable_session_radix_cache``, ``mem_cache/unified_cache/session_ref_tracker.py``) is the
  opposite tool: it holds a session's KV referenced until ``close_session`` releases it to ordinary eviction, so
  every session must be closed or the cache fills; these servers do not turn it on.
- Routed experts (MoE routing replay): with SGLang started with ``enable_return_routed_experts`` (an engine kwarg
  of the actors) and a MoE model, GetServerInfo reports the MoE layers, top-k and expert count and a request may
  set ``return_routed_experts``; otherwise the three are 0 and such a request is FAILED_PRECONDITION. SGLang sends
  a request's routing with its finished output only (``routing.py``), so a routed request's chunks are held until
  it ends and then all leave, each with its tokens' rows (as with ``final_only``); one aborted before SGLang's
  final output (a cancelled stream) reports no tokens rather than tokens without routing.
- GetLoad's ``preemptions`` is 0: SGLang retracts (preempts) decode requests under KV pressure, but its load
  snapshot (``get_loads``) carries only the number retracted now (``queues.retracted``), not a running count; the
  count exists only as the Prometheus counter ``sglang:num_retracted_requests_total`` of a server with metrics on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from agentloop_grpc.common.errors import (
    EngineError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
)
from agentloop_grpc.common.types import (
    FinishReason,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    LoadInfo,
    NamedTensor,
    Resource,
    ServerFacts,
    TokenChunk,
)
from agentloop_grpc.common.weight_layout import BucketLayout, WeightGroupSpec

from .. import validation
from ..block_hash import version_salt
from ..image_placeholders import check_no_stray_image_token
from ..routed_rows import split_rows
from .actor import PAUSE_IN_PLACE
from .config import SglangEngineConfig
from .discovery import TpGroup, find_tp_group
from .facts import EngineFacts, EngineLoad
from .outputs import StreamEnd

log = logging.getLogger(__name__)

_TAGS = {Resource.WEIGHTS: "weights", Resource.KV_CACHE: "kv_cache"}  # in the order WakeUp resumes them


def _tags(resources: frozenset[Resource]) -> list[str]:
    return [tag for resource, tag in _TAGS.items() if resource in resources]


@dataclass(slots=True)
class _InFlight:
    """One request between Generate and its completion."""

    request: GenerateRequest
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    stream: ray.ObjectRefGenerator | None = None  # None until dispatched to the actor
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
        self._weight_version: Callable[[], int] = lambda: 0
        self._in_flight: dict[str, _InFlight] = {}
        self._prompt_tokens_seen = 0
        self._prompt_tokens_cached = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, weight_version: Callable[[], int]) -> ServerFacts:
        self._weight_version = weight_version
        if not ray.is_initialized():
            ray.init(address=self.config.ray_address or "auto", log_to_driver=False)
        self._group = await find_tp_group(self.config)
        self._facts = facts = await self._group.leader.start.remote()
        self._engine_load = await self._group.leader.load.remote()
        self._poll_task = asyncio.create_task(self._poll_load(), name="sglang-load-poll")
        images = self.config.max_images_per_request if facts.image_token_id is not None else 0
        return ServerFacts(
            engine_kind="sglang",
            engine_version=facts.engine_version,
            model_id=self.config.model_id or facts.model_path,
            tokenizer_fingerprint=facts.tokenizer_fingerprint,
            vocab_size=facts.vocab_size,
            max_model_len=facts.context_len,
            eos_token_ids=facts.eos_token_ids,
            dp_rank=self.config.dp_rank,
            dp_size=self.config.dp_size,
            tp_size=self.config.tp_size,
            sleep_releases_memory=facts.memory_saver,
            supports_structured_output=True,
            weight_group_ranks=1,  # the rank-0 actor receives for every TP rank (module docstring)
            default_max_new_tokens=self.config.default_max_new_tokens,
            supports_images=images > 0,
            max_images_per_request=images,
            routed_expert_layers=len(facts.routing.moe_layers) if facts.routing else 0,
            routed_experts_per_token=facts.routing.per_token if facts.routing else 0,
            num_experts=facts.routing.num_experts if facts.routing else 0,
        )

    async def shutdown(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
        await self.abort(list(self._in_flight))
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

    async def _call(self, method: str, *args: object) -> Any:  # Ray's remote methods, named at run time
        """Await one call on the rank-0 actor; a dead actor is UNAVAILABLE (retry on another server)."""
        try:
            return await getattr(self._leader(), method).remote(*args)
        except ray.exceptions.RayActorError as error:
            raise self._gone(error) from error

    # -- load ----------------------------------------------------------------------------------------------

    def load(self) -> LoadInfo:
        snapshot = self._engine_load
        seen = self._prompt_tokens_seen
        return LoadInfo(
            running_requests=len(self._in_flight),
            waiting_requests=0,
            kv_cache_usage=min(1.0, max(0.0, snapshot.kv_cache_usage)) if snapshot else 0.0,
            prefix_cache_hit_rate=self._prompt_tokens_cached / seen if seen else 0.0,
            max_running_requests=max(1, snapshot.max_running_requests) if snapshot else 1,
        )

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        if self._facts.image_token_id is not None:
            check_no_stray_image_token(request.prompt_ids, request.media, self._facts.image_token_id)
        entry = _InFlight(request)
        self._in_flight[request.request_id] = entry
        end: StreamEnd | None = None
        # SGLang sends a request's routing with its finished output only: its chunks are held until then
        held: list[TokenChunk] | None = [] if request.sampling.return_routed_experts else None
        prompt_routing = b""
        try:
            async for event in self._stream(entry):
                if isinstance(event, StreamEnd):
                    end = event
                elif held is not None:
                    held.append(event)
                else:
                    yield event
            if end is None:  # aborted: its stream was cancelled
                end = StreamEnd(FinishReason.ABORT, prompt_tokens=len(request.prompt_ids), cached_tokens=0)
            else:  # SGLang's own counts feed the hit rate
                self._prompt_tokens_seen += end.prompt_tokens
                self._prompt_tokens_cached += end.cached_tokens
            if held and end.reason is FinishReason.ABORT and not end.routed_experts:
                # an aborted request's tokens have no routing: they are dropped, never sent without it
                entry.emitted = 0
            elif held is not None:
                prompt_routing, held = split_rows(end.routed_experts, self._facts.routing.row_bytes,
                                                  len(request.prompt_ids), held, "SGLang")
                for chunk in held:
                    yield chunk
            yield GenerateComplete(
                finish_reason=end.reason,
                prompt_tokens=end.prompt_tokens,
                completion_tokens=entry.emitted,
                weight_version=self._weight_version(),
                cached_prompt_tokens=end.cached_tokens,
                matched_stop_token_id=end.matched_stop_token_id,
                prompt_images=len(request.media),
                prompt_routed_experts=prompt_routing,
            )
        finally:
            if end is None:
                entry.abort()
            del self._in_flight[request.request_id]

    async def _stream(self, entry: _InFlight) -> AsyncIterator[TokenChunk | StreamEnd]:
        """TokenChunks, then the StreamEnd; nothing more once the entry is aborted (the caller ends it)."""
        leader = self._leader()
        salt = version_salt(self._weight_version())  # the version it is submitted under (module docstring)
        entry.stream = leader.generate.options(num_returns="streaming").remote(entry.request, salt)
        try:
            async for ref in entry.stream:
                delta = await ref
                if entry.aborted.is_set():  # deltas already in flight when the abort landed are dropped
                    return
                end = delta.end
                if end is not None and end.rejected is not None and not entry.emitted:
                    raise validation.invalid(validation.ENGINE_REJECTED, engine="SGLang", reason=end.rejected)
                if delta.token_ids:
                    entry.emitted += len(delta.token_ids)
                    yield TokenChunk(delta.token_ids, self._weight_version(), delta.logprobs, delta.top_logprobs)
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

    async def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            entry = self._in_flight.get(request_id)
            if entry is not None:
                entry.abort()

    # -- control ---------------------------------------------------------------------------------------------

    async def release(self, resources: frozenset[Resource]) -> None:
        if self._facts is not None and self._facts.memory_saver:
            await self._call("release_memory", _tags(resources))
        self._prompt_tokens_seen = self._prompt_tokens_cached = 0  # SGLang's prefix cache goes with the KV cache

    async def restore(self, resources: frozenset[Resource]) -> None:
        if self._facts is not None and self._facts.memory_saver:
            await self._call("resume_memory", _tags(resources))

    async def freeze(self) -> None:
        await self._call("pause", PAUSE_IN_PLACE)

    async def thaw(self) -> None:
        await self._call("resume")

    async def update_weights(self, tensors: Sequence[NamedTensor], weight_version: int, flush_cache: bool) -> None:
        success, message = await self._call("update_weights", list(tensors), flush_cache, weight_version)
        if not success:
            raise InvalidRequestError(f"SGLang refused the weight update: {message}")
        if flush_cache:
            self._prompt_tokens_seen = self._prompt_tokens_cached = 0

    async def load_weights(self, path: str, weight_version: int, flush_cache: bool) -> tuple[int, int]:
        loaded = await self._call("load_weights", path, flush_cache, weight_version)
        self._updated(loaded, flush_cache)
        return loaded

    async def join_weight_group(self, group: WeightGroupSpec) -> list[int]:
        ranks = await self._call("join_weight_group", group)
        if isinstance(ranks, EngineError):
            raise ranks
        return ranks

    async def receive_weights(
        self, group: str, layout: BucketLayout, weight_version: int, flush_cache: bool, refusal: EngineError | None
    ) -> None:
        self._updated(await self._call("receive_weights", group, layout, flush_cache, weight_version, refusal),
                      flush_cache)

    async def leave_weight_group(self, group: str) -> None:
        await self._call("leave_weight_group", group)

    def _updated(self, answer: object, flush_cache: bool) -> None:
        """Raise the actor's refusal, if that is what it answered; else note a flushed cache."""
        if isinstance(answer, EngineError):
            raise answer
        if flush_cache:
            self._prompt_tokens_seen = self._prompt_tokens_cached = 0

    async def end_sessions(self, session_ids: Sequence[str]) -> int:
        """0: SGLang cannot demote a request's radix-cache nodes (module docstring)."""
        return 0

    async def flush_cache(self) -> None:
        if not await self._call("flush_cache"):
            raise FailedPreconditionError(
                "SGLang refused to flush the cache: requests are running (or kept by Pause(KEEP)); "
                "finish or abort them first"
            )
        self._prompt_tokens_seen = self._prompt_tokens_cached = 0
