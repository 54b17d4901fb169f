"""Router: the client library through which agent loops reach many engine servers (one per DP group).

The servers, their health and load, and the control calls are the Fleet's (fleet.py); the Router adds sessions
and generation on top of it. Sessions (trajectories) stick to a server so the prefix cache pays off, within a
bounded imbalance (policy.py). Every generate has a deadline. Cancelling the caller's task cancels the call, which
aborts the request inside the engine, and an explicit Abort follows in case the cancellation could not reach it.
An attempt that fails with UNAVAILABLE (server killed, draining, asleep) or RESOURCE_EXHAUSTED resumes on another
server from the tokens already received, so the caller sees one uninterrupted generation; other errors are the
request's and are never retried. A generate() whose whole budget fits one grouped message is a unary
GenerateUnary call instead of a stream: its stream could not have delivered anything earlier, and a unary call
costs both ends less CPU. Servers that serve an older weight version than the fleet's take no new requests
(versions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Sequence
from pathlib import Path

import grpc

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import FinishReason, SamplingParams, TokenChunk
from agentloop_grpc.v1 import generation_pb2

from .attempts import CallProgress, attempt_request, ended_before_resume
from .call import GenerateCall
from .config import Placement, RouterConfig
from .discovery import discovery_addresses, discovery_config
from .endpoint import Endpoint
from .errors import InfrastructureError, RequestError
from .fanout import FanOutResult
from .fleet import Fleet
from .policy import STICKY, Decision, Hints, choose_server, decision_for, keeps, place
from .prefix_index import PrefixIndex
from .result import GenerateResult
from .sessions import StickySessions
from .versions import ExpectedVersion

log = logging.getLogger(__name__)

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
#: Ended sessions are told to their server in batches gathered over this long, at most this many per call.
_END_SESSIONS_DELAY_S, _END_SESSIONS_BATCH = 0.2, 1024
#: How often a new session waiting out KV pressure looks again.
_PRESSURE_POLL_S = 0.05


class Router:
    """Routes generate calls over a Fleet of engine servers; see the module docstring. Use ``async with``."""

    def __init__(self, servers: Sequence[str], config: RouterConfig | None = None,
                 discovery_file: str | Path | None = None, expected: ExpectedVersion | None = None) -> None:
        self.fleet = Fleet(servers, config, discovery_file, expected)
        self.config = self.fleet.config
        self.metrics = self.fleet.metrics
        self._sessions = StickySessions(self.config.max_sessions, self.config.session_ttl_s)
        # as an enum whatever the config holds: one copied with model_copy(update=...) may hold a plain string
        self._placement = Placement(self.config.placement)
        self._sticky = self._placement in STICKY
        self._prefixes = PrefixIndex(self.config.prefix_index_blocks, self.config.prefix_block_tokens)
        self._indexed_version = 0
        self._sequence = itertools.count()  # round_robin's turn
        self._ended: dict[str, list[str]] = {}  # server -> sessions ended there, not yet told (EndSessions)
        self._no_end_sessions: set[str] = set()  # servers that answered EndSessions with UNIMPLEMENTED
        self._active: dict[str, dict[str, Endpoint]] = {}  # session -> request id -> endpoint
        self._background: set[asyncio.Task] = set()
        self._decisions = self.metrics.decisions.counts  # every generate counts one decision and one attempt
        self._attempts = self.metrics.attempts.counts
        self._request_id_prefix = uuid.uuid4().hex
        self._request_counter = itertools.count()
        self._grouped = (
            generation_pb2.StreamOptions(min_chunk_tokens=self.config.generate_chunk_tokens)
            if self.config.generate_chunk_tokens > 1
            else None
        )

    @classmethod
    def from_discovery_file(cls, path: str | Path, config: RouterConfig | None = None,
                            expected: ExpectedVersion | None = None) -> Router:
        """Servers from a launcher's discovery file, reached with the file's security settings unless ``config``
        has its own; while entered, the file is followed (``RouterConfig.discovery_poll_s``)."""
        return cls(discovery_addresses(path), discovery_config(path, config), discovery_file=path, expected=expected)

    async def __aenter__(self) -> Router:
        await self.fleet.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self.fleet.close()
        for task in list(self._background):
            task.cancel()

    # -- sessions --------------------------------------------------------------------------------------------

    def session_server(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    @property
    def live_sessions(self) -> int:
        """Sessions whose placement the Router remembers (ended ones are not: see ``sessions.py``)."""
        return len(self._sessions)

    @property
    def live_groups(self) -> int:
        """GRPO groups with a live session: none is remembered after its last session."""
        return self._sessions.live_groups

    def close_session(self, session_id: str) -> None:
        """A trajectory (or gateway session) ended: forget its placement, so memory stays flat, and tell its server
        that the session's cached blocks may be evicted first."""
        address = self._sessions.close(session_id)
        if address is not None and address not in self._no_end_sessions:
            ended = self._ended.setdefault(address, [])
            ended.append(session_id)
            if len(ended) == 1:  # the first of a batch: sent a moment later with those that follow
                self._spawn(self._send_ended(address))

    async def _send_ended(self, address: str) -> None:
        """EndSessions for the sessions that ended on ``address`` in the last moment: one call for many."""
        await asyncio.sleep(_END_SESSIONS_DELAY_S)
        session_ids = self._ended.pop(address, [])
        endpoint = self.fleet.servers.get(address)
        if not session_ids or endpoint is None or not endpoint.healthy:
            return
        for start in range(0, len(session_ids), _END_SESSIONS_BATCH):
            request = generation_pb2.EndSessionsRequest(session_ids=session_ids[start:start + _END_SESSIONS_BATCH])
            try:
                await endpoint.generate.EndSessions(request, timeout=self.config.control_timeout_s)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # a server older than the hint: stop sending it
                    self._no_end_sessions.add(address)
                log.debug("EndSessions on %s failed: %s", address, error.code().name)
                return

    async def _pick(self, progress: CallProgress, avoid: set[str]) -> Endpoint:
        """Choose a server for the session's next request (preferring servers not in ``avoid``, which just failed
        this request), waiting a bounded time for one."""
        fleet, config, call, deadline = self.fleet, self.config, progress.call, progress.deadline
        session_id = call.session_id
        current = self._sessions.get(session_id)
        # most calls: a session on a routable server within the imbalance bound, judged without reading every load
        sticky = fleet.sticky_loads(current) if current is not None and not avoid and self._sticky else None
        if sticky is not None and keeps(sticky[0], sticky[1], config):
            address, decision = current, Decision.STICKY
        else:  # new, or moving, or judged over every routable load (servers held out, or this request's failed)
            loads = await fleet.routable_loads(min(deadline, time.monotonic() + config.no_server_wait_s), avoid)
            if (self._sticky and current is not None and current in loads
                    and keeps(loads[current], min(loads.values()), config)):
                address, decision = current, Decision.STICKY
            elif self._placement is Placement.CACHE_AWARE:
                address, decision = await self._place(progress, current, loads, avoid)
            else:
                address, decision = choose_server(session_id, current, loads, config, sequence=next(self._sequence))
        self._decisions[decision.value] += 1
        if decision is Decision.MOVED:
            log.debug("session %s moves to %s", session_id, address)
        self._sessions.remember(session_id, address, time.monotonic(), call.group_id)
        return fleet.endpoint(address)

    async def _place(
        self, progress: CallProgress, current: str | None, loads: dict[str, int], avoid: set[str]
    ) -> tuple[str, Decision]:
        """cache_aware's choice for a session that is new or leaves its server: group, prefix and KV pressure."""
        fleet, call, deadline = self.fleet, progress.call, progress.deadline
        pressured = [a for a in loads if fleet.endpoint(a).pressured]
        # admission backs off while every server is under KV pressure: a thrashing engine gains nothing by more
        until = min(deadline, time.monotonic() + self.config.pressure_wait_s)
        while len(pressured) == len(loads) and time.monotonic() < until:
            await asyncio.sleep(_PRESSURE_POLL_S)
            loads = await fleet.routable_loads(min(deadline, time.monotonic() + self.config.no_server_wait_s), avoid)
            pressured = [a for a in loads if fleet.endpoint(a).pressured]
        if self._indexed_version != fleet.weight_version:  # caches keyed by version no longer serve older blocks
            self._prefixes.clear()
            self._indexed_version = fleet.weight_version
        keys = self._prefixes.keys(progress.prompt) if current is None else []  # the bytes the request carries
        hints = Hints(
            group=self._sessions.group_servers(call.group_id),
            prefix=self._prefixes.matched(keys) if keys else {},
            pressured=pressured,
        )
        address = place(call.session_id, loads, self.config, hints)  # _pick found the session not kept
        if keys:
            self._prefixes.record(keys, address)
        return address, decision_for(current, address)

    async def abort(self, session_id: str) -> FanOutResult:
        """Abort the session's in-flight requests; their streams end with FINISH_REASON_ABORT."""
        by_server: dict[str, list[str]] = {}
        for request_id, endpoint in self._active.get(session_id, {}).items():
            by_server.setdefault(endpoint.address, []).append(request_id)
        return await self.fleet.abort(by_server)

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(self, call: GenerateCall) -> GenerateResult:
        """Generate to the end and return the whole result.

        Tokens arrive grouped (``RouterConfig.generate_chunk_tokens``). A request whose whole budget fits in one
        such group takes the unary GenerateUnary RPC instead of a stream (``RouterConfig.unary_generate``): the
        stream would deliver nothing before its end either, so a failover loses nothing more.

        Raises RequestError for a request the engine refuses (never retried), InfrastructureError when no
        server could finish it (servers down, retries exhausted, deadline passed).
        """
        if self._fits_one_message(call.sampling):
            return await self._unary_attempts(call)
        events = self._stream_attempts(call, self._grouped)
        result = None
        async with contextlib.aclosing(events):
            # run the generator to its end rather than leaving at the result: closing a generator suspended at
            # a yield throws GeneratorExit through it, which costs more than finishing
            async for event in events:
                if isinstance(event, GenerateResult):
                    result = event
        if result is None:
            raise InfrastructureError("the stream ended without a result")
        return result

    def _fits_one_message(self, sampling: SamplingParams | None) -> bool:
        """Whether generate()'s grouped stream would carry this request's every token in its final message."""
        return (
            self.config.unary_generate
            and sampling is not None
            and sampling.max_new_tokens <= self.config.generate_chunk_tokens
        )

    def stream(
        self, call: GenerateCall, *, min_chunk_tokens: int = 0, final_only: bool = False
    ) -> AsyncGenerator[TokenChunk | GenerateResult, None]:
        """Yield TokenChunks as they arrive, then one GenerateResult; raises as ``generate`` does.

        Every token is sent as decoded unless ``min_chunk_tokens`` groups them (StreamOptions) or ``final_only``
        sends them all at the end; tokens the server sent with its final message are yielded as one last chunk
        before the result.
        """
        options = None
        if min_chunk_tokens or final_only:
            options = generation_pb2.StreamOptions(min_chunk_tokens=min_chunk_tokens, final_only=final_only)
        return self._stream_attempts(call, options)

    async def _unary_attempts(self, call: GenerateCall) -> GenerateResult:
        """``generate`` as GenerateUnary calls: each attempt's tokens arrive with its answer; a retried attempt, or
        a resumed ABORT, goes on from the tokens received."""
        progress = self._progress(call)
        attempt = 0
        while True:
            attempt += 1
            # 1. a server for this attempt; a resumed one may find the lost attempt had in fact finished
            endpoint, default_budget, ended = await self._next_server(progress, attempt)
            if ended is not None:
                return ended
            # 2. the request, built before a slot is taken (filled in place: copying a whole request into its
            # wrapper costs more)
            attempt_id = progress.attempt_id(attempt)
            request = generation_pb2.GenerateUnaryRequest()
            attempt_request(attempt_id, call, progress.prompt, progress.token_ids, None, request.request,
                            default_budget, progress.resumes)
            await self._take_slot(endpoint, progress)
            rpc = endpoint.generate.GenerateUnary(request, timeout=progress.left_s())
            # 3. the answer: every token, then the completion; 4. a retryable failure leaves the block without
            # one, and another attempt follows
            with _Attempt(self, endpoint, progress, attempt, attempt_id, rpc, unary=True) as outcome:
                response = await rpc
                for chunk in response.chunks:
                    progress.add(chunk)
                progress.add(response.complete.tokens)
                outcome.complete = response.complete
            if outcome.complete is None:
                await self._backoff(progress.failures)
            elif not self._resumes(progress, endpoint, outcome.complete):
                return self._completed(progress, endpoint, outcome.complete)

    async def _stream_attempts(
        self, call: GenerateCall, stream_options: generation_pb2.StreamOptions | None
    ) -> AsyncGenerator[TokenChunk | GenerateResult, None]:
        """``stream`` and a streamed ``generate``: each attempt a Generate stream whose tokens are yielded as they
        arrive; a retried attempt, or a resumed ABORT, goes on from the tokens received."""
        progress = self._progress(call)
        attempt = 0
        while True:
            attempt += 1
            # 1. a server for this attempt; a resumed one may find the lost stream had in fact finished
            endpoint, default_budget, ended = await self._next_server(progress, attempt)
            if ended is not None:
                yield ended
                return
            # 2. the request, built before a slot is taken: a request that cannot be built holds none
            attempt_id = progress.attempt_id(attempt)
            request = generation_pb2.GenerateRequest()
            attempt_request(attempt_id, call, progress.prompt, progress.token_ids, stream_options, request,
                            default_budget, progress.resumes)
            await self._take_slot(endpoint, progress)
            rpc = endpoint.generate.Generate(request, timeout=progress.left_s())
            # 3. the tokens, as they arrive; then the completion; 4. a retryable failure leaves the block without
            # one, and another attempt follows, resuming from the tokens received
            with _Attempt(self, endpoint, progress, attempt, attempt_id, rpc, unary=False) as outcome:
                # read() rather than ``async for``: one async-generator layer less per message
                while (message := await rpc.read()) is not grpc.aio.EOF:
                    if message.HasField("complete"):
                        outcome.complete = message.complete
                        if message.complete.tokens.token_ids:  # tokens grouped into the final message
                            progress.add(message.complete.tokens)
                            yield wire.chunk_from_proto(message.complete.tokens)
                        break
                    progress.add(message.chunk)
                    yield wire.chunk_from_proto(message.chunk)
                if outcome.complete is None:
                    raise InfrastructureError(f"{endpoint.address} ended the stream of {attempt_id} without a result")
            if outcome.complete is None:
                await self._backoff(progress.failures)
            elif not self._resumes(progress, endpoint, outcome.complete):
                yield self._completed(progress, endpoint, outcome.complete)
                return

    def _resumes(self, progress: CallProgress, endpoint: Endpoint, complete: generation_pb2.GenerateComplete) -> bool:
        """An attempt completed (its prompt's routing is kept, when asked); whether it ended with ABORT and is
        resumed (another attempt follows): while the call has resumes left (GenerateCall.max_resumes)."""
        if progress.routing is not None:
            progress.prompt_routed(complete.prompt_routed_experts)
        aborted = complete.finish_reason == generation_pb2.FINISH_REASON_ABORT
        if not aborted or progress.resumes >= progress.call.max_resumes:
            return False
        self.fleet.produced_with(endpoint.address, complete.weight_version)
        progress.resumes += 1
        self.metrics.resumes.inc()
        return True

    def _progress(self, call: GenerateCall) -> CallProgress:
        timeout_s = call.timeout_s or self.config.generate_timeout_s
        base_id = call.request_id or self._new_request_id()
        return CallProgress(call, base_id, timeout_s, self.metrics.first_token_seconds.observe)

    async def _next_server(
        self, progress: CallProgress, attempt: int
    ) -> tuple[Endpoint, int, GenerateResult | None]:
        """The server of the next attempt and its default budget (0: none known); with the result when the tokens
        received before a failure already end the generation (only its final message was missing)."""
        endpoint = await self._pick(progress, avoid=progress.failed)
        info = endpoint.info
        eos = info.eos_token_ids if info is not None else None
        default_budget = info.default_max_new_tokens if info is not None else 0
        if attempt > 1:
            ended = ended_before_resume(progress.token_ids, progress.call.sampling, eos, default_budget)
            if ended is not None:
                # a server that produced tokens read every image (or would have refused the call)
                return endpoint, default_budget, self._result(progress, *ended, 0, len(progress.call.media))
        return endpoint, default_budget, None

    async def _take_slot(self, endpoint: Endpoint, progress: CallProgress) -> None:
        """One of the endpoint's call slots, waited for until the call's deadline at most."""
        if not await endpoint.take_slot(progress.deadline):
            raise InfrastructureError(
                f"generate {progress.base_id} reached its deadline waiting for a stream slot on {endpoint.address} "
                f"(all {self.config.max_streams_per_server} taken: RouterConfig.max_streams_per_server)"
            )

    def _completed(
        self, progress: CallProgress, endpoint: Endpoint, complete: generation_pb2.GenerateComplete
    ) -> GenerateResult:
        self.fleet.produced_with(endpoint.address, complete.weight_version)
        if complete.HasField("load"):  # the server's load after this request: its next poll can wait
            endpoint.report_load(complete.load)
        matched = complete.matched_stop_token_id if complete.HasField("matched_stop_token_id") else None
        finish_reason = wire.FINISH_REASONS_FROM_PROTO[complete.finish_reason]
        return self._result(progress, finish_reason, matched, complete.cached_prompt_tokens, complete.prompt_images)

    def _result(
        self, progress: CallProgress, finish_reason: FinishReason, matched: int | None, cached: int, images: int
    ) -> GenerateResult:
        elapsed = time.monotonic() - progress.started
        self.metrics.generate_seconds.observe(elapsed)
        return progress.result(finish_reason, matched, cached, images, elapsed)

    def _new_request_id(self) -> str:
        """This Router's random prefix and a counter: unique across Routers and processes as a uuid4 per call
        would be, for a fraction of its cost."""
        return f"{self._request_id_prefix}-{next(self._request_counter)}"

    def _begin_attempt(
        self, endpoint: Endpoint, progress: CallProgress, attempt_id: str, call: grpc.aio.Call, unary: bool
    ) -> None:
        """An attempt holding one of the endpoint's call slots has started ``call``."""
        endpoint.begin_request(call)
        if progress.routing is not None and endpoint.info is not None:
            info = endpoint.info
            progress.routed_on(info.routed_expert_layers, info.routed_experts_per_token, info.num_experts)
        progress.servers.append(endpoint.address)
        self._active.setdefault(progress.call.session_id, {})[attempt_id] = endpoint
        self._attempts["unary" if unary else "stream"] += 1

    def _end_attempt(
        self, endpoint: Endpoint, progress: CallProgress, attempt_id: str, call: grpc.aio.Call, finished: bool
    ) -> None:
        """An attempt is over (finished, failed, cancelled or closed early): free its slot, and free the engine of
        it unless it finished."""
        endpoint.stream_slots.release()
        endpoint.end_request(call)
        session_id = progress.call.session_id
        active = self._active.get(session_id, {})
        active.pop(attempt_id, None)
        if not active:
            self._active.pop(session_id, None)
        if not finished:
            if not call.done():
                call.cancel()
            # the caller's cancellation cancels the call too (it is done by now): an Abort follows either way, in
            # case the cancellation does not reach the engine; a call the server ended needs none
            if call.cancelled():
                self._spawn(self._abort_on(endpoint, [attempt_id]))

    def _attempt_failed(
        self, error: grpc.aio.AioRpcError, endpoint: Endpoint, progress: CallProgress, attempt: int
    ) -> None:
        """Raise unless the failure is worth another attempt; count a failover when tokens had been received (the
        next attempt resumes from them)."""
        code = error.code()
        base_id = progress.base_id
        if code not in _RETRYABLE:
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise InfrastructureError(f"generate {base_id} exceeded its deadline") from error
            raise RequestError(code, error.details() or "", endpoint.address) from error
        self.metrics.retries.labels(code.name).inc()
        progress.failed.add(endpoint.address)
        if code == grpc.StatusCode.UNAVAILABLE:
            endpoint.mark_unavailable()
        if progress.token_ids:
            self.metrics.failovers.inc()
            progress.failovers += 1
        progress.failures += 1
        log.warning("generate %s: %s from %s (attempt %d)", base_id, code.name, endpoint.address, attempt)
        if progress.failures >= self.config.max_attempts or time.monotonic() >= progress.deadline:
            raise InfrastructureError(
                f"generate {base_id} failed on {progress.failures} attempts; last: {code.name} from "
                f"{endpoint.address}"
            ) from error

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (attempt - 1)))

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_on(self, endpoint: Endpoint, request_ids: list[str]) -> None:
        try:
            await endpoint.generate.Abort(generation_pb2.AbortRequest(request_ids=request_ids), timeout=5)
        except grpc.aio.AioRpcError as error:  # the server is gone: nothing left to abort there
            log.debug("abort on %s failed: %s", endpoint.address, error.code().name)
        except grpc.aio.UsageError:  # the Router closed the channel, which cancelled the call already
            log.debug("abort on %s skipped: its channel is closed", endpoint.address)


class _Attempt:
    """One attempt's RPC, as a ``with`` block: it counts as in flight on its server while inside; on leaving, its
    call slot is freed (and the engine freed of it unless it completed), and a retryable failure is swallowed so
    that the caller's loop tries again."""

    __slots__ = ("_endpoint", "_number", "_progress", "_request_id", "_router", "_rpc", "_unary", "complete")

    def __init__(
        self, router: Router, endpoint: Endpoint, progress: CallProgress, number: int, request_id: str,
        rpc: grpc.aio.Call, unary: bool,
    ) -> None:
        self._router, self._endpoint, self._progress, self._number = router, endpoint, progress, number
        self._request_id, self._rpc, self._unary = request_id, rpc, unary
        self.complete: generation_pb2.GenerateComplete | None = None

    def __enter__(self) -> _Attempt:
        self._router._begin_attempt(self._endpoint, self._progress, self._request_id, self._rpc, self._unary)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> bool:
        router, endpoint = self._router, self._endpoint
        try:
            if isinstance(error, grpc.aio.AioRpcError):  # any other code raises: the request's fault, or the deadline
                router._attempt_failed(error, endpoint, self._progress, self._number)
                return True
            if isinstance(error, asyncio.CancelledError) and endpoint.abandoned(self._rpc):
                # the server stopped answering and its calls were cancelled: fail over as from a dead server
                router._attempt_failed(endpoint.hung_error(), endpoint, self._progress, self._number)
                return True
            return False  # none, the caller's cancellation or a closed stream: it goes on as it was
        finally:
            router._end_attempt(endpoint, self._progress, self._request_id, self._rpc, self.complete is not None)
