"""Router: the client library through which agent loops reach many engine servers (one per DP group).

Sessions (trajectories) stick to a server so the prefix cache pays off, within a bounded imbalance (policy.py).
Every generate has a deadline. Cancelling the caller's task cancels the stream, which aborts the request inside
the engine, and an explicit Abort follows in case the cancellation could not reach it. A stream that fails with
UNAVAILABLE (server killed, draining, asleep) or RESOURCE_EXHAUSTED resumes on another server from the tokens
already received, so the caller sees one uninterrupted generation; other errors are the request's and are never
retried. A generate() whose whole budget fits one grouped message is a unary GenerateUnary call instead: its
stream could not have delivered anything earlier, and a unary call costs both ends less CPU. Servers that serve an
older weight version than the fleet's take no new requests (versions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import grpc

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import NamedTensor, TokenChunk
from agentloop_grpc.security import ClientSecurity
from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .attempts import Received, attempt_request, ended_before_resume
from .config import RouterConfig
from .endpoint import Endpoint
from .errors import InfrastructureError, NoHealthyServerError, RequestError
from .fanout import FanOutResult, weight_update_messages
from .metrics import RouterMetrics
from .policy import Decision, choose_server
from .prompts import PromptPacker, extended, prompt_length
from .result import GenerateResult
from .versions import WeightVersions

log = logging.getLogger(__name__)

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


class Router:
    """Routes generate calls over engine servers; see the module docstring. Use ``async with Router(...)``."""

    def __init__(self, servers: Sequence[str], config: RouterConfig | None = None) -> None:
        self.config = config or RouterConfig()
        self.metrics = RouterMetrics()
        self._endpoints: dict[str, Endpoint] = {}
        self._versions = WeightVersions(self.metrics)
        self._initial = list(servers)
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._active: dict[str, dict[str, Endpoint]] = {}  # session -> request id -> endpoint
        self._background: set[asyncio.Task] = set()
        # label lookups cost a lock and a validation each: every generate counts one decision
        self._decision_counters = {decision: self.metrics.decisions.labels(decision.value) for decision in Decision}
        self._attempt_counters = {
            unary: self.metrics.attempts.labels("unary" if unary else "stream") for unary in (False, True)
        }
        self._prompts = PromptPacker(self.config.prompt_memo_ids)
        self._request_id_prefix = uuid.uuid4().hex
        self._request_counter = itertools.count()
        self._generate_stream_options = (
            generation_pb2.StreamOptions(min_chunk_tokens=self.config.generate_chunk_tokens)
            if self.config.generate_chunk_tokens > 1
            else None
        )

    @classmethod
    def from_discovery_file(cls, path: str | Path, config: RouterConfig | None = None) -> Router:
        """Servers from a launcher's discovery file (see ``discovery_addresses``), reached with the file's
        security settings unless ``config`` has its own."""
        config = config or RouterConfig()
        security = discovery_security(path)
        if config.security is None and security is not None:
            config = config.model_copy(update={"security": security})
        return cls(discovery_addresses(path), config)

    async def __aenter__(self) -> Router:
        for address in self._initial:
            await self.add_server(address)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        for address in list(self._endpoints):
            await self.remove_server(address)
        for task in list(self._background):
            task.cancel()

    # -- servers ---------------------------------------------------------------------------------------------

    @property
    def servers(self) -> dict[str, Endpoint]:
        return dict(self._endpoints)

    async def add_server(self, address: str) -> None:
        if address in self._endpoints:
            return
        endpoint = Endpoint(address, self.config, self.metrics, self._versions)
        self._endpoints[address] = endpoint
        endpoint.start()

    async def remove_server(self, address: str) -> None:
        """Stop routing to ``address``; its sessions move on their next request. In-flight calls are cancelled."""
        endpoint = self._endpoints.pop(address, None)
        if endpoint is not None:
            await endpoint.close()
            self._versions.forget(address)

    @property
    def weight_version(self) -> int:
        """The fleet's weight version as this Router knows it (see versions.py)."""
        return self._versions.expected

    @property
    def held_out(self) -> frozenset[str]:
        """Servers held out of routing for serving an older weight version than the fleet's."""
        return self._versions.behind

    def expect_weight_version(self, version: int) -> None:
        """The fleet was updated to ``version`` through another Router: hold out servers below it from now on."""
        self._versions.expect(version)

    async def wait_ready(self, min_servers: int = 1, timeout_s: float = 60.0) -> None:
        """Wait until at least ``min_servers`` servers report SERVING (whatever their weight version)."""
        deadline = time.monotonic() + timeout_s
        while sum(e.healthy for e in self._endpoints.values()) < min_servers:
            if time.monotonic() > deadline:
                raise NoHealthyServerError(f"fewer than {min_servers} servers became healthy within {timeout_s} s")
            await asyncio.sleep(0.02)

    # -- sessions --------------------------------------------------------------------------------------------

    def session_server(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    def close_session(self, session_id: str) -> None:
        """Forget a finished trajectory's placement (and its remembered prompt)."""
        self._sessions.pop(session_id, None)
        self._prompts.forget(session_id)

    def _remember(self, session_id: str, address: str) -> None:
        self._sessions[session_id] = address
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.config.max_sessions:
            self._sessions.popitem(last=False)

    async def _pick(self, session_id: str, deadline: float, avoid: set[str] = frozenset()) -> Endpoint:
        """Choose a healthy server for the session's next request (preferring servers not in ``avoid``, which
        just failed this request), waiting a bounded time for one."""
        wait_until = min(deadline, time.monotonic() + self.config.no_server_wait_s)
        while True:
            behind = self._versions.behind
            loads = {a: e.load for a, e in self._endpoints.items() if e.healthy and a not in behind}
            if avoid:
                loads = {a: load for a, load in loads.items() if a not in avoid} or loads
            if loads:
                break
            if time.monotonic() >= wait_until:
                held = f"; held out below weight version {self._versions.expected}: {sorted(behind)}" if behind else ""
                raise NoHealthyServerError(f"no healthy engine server among {sorted(self._endpoints)}{held}")
            await asyncio.sleep(0.02)
        address, decision = choose_server(session_id, self._sessions.get(session_id), loads, self.config)
        self._decision_counters[decision].inc()
        if decision is Decision.MOVED:
            log.debug("session %s moves to %s", session_id, address)
        self._remember(session_id, address)
        return self._endpoints[address]

    # -- generation ------------------------------------------------------------------------------------------

    async def generate(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        params: generation_pb2.SamplingParams | None = None,
        **options,
    ) -> GenerateResult:
        """Generate to the end and return the whole result (see ``stream`` for the options).

        Tokens arrive grouped (``RouterConfig.generate_chunk_tokens``) unless ``stream_options`` says otherwise.
        A request whose whole budget fits in one such group takes the unary GenerateUnary RPC instead of a
        stream (``RouterConfig.unary_generate``): the stream would deliver nothing before its end either, so a
        failover loses nothing more, and a unary call costs both ends less CPU.
        """
        if "stream_options" not in options and self._fits_one_message(params):
            return await self._generate_unary(session_id, prompt_ids, params, **options)
        options.setdefault("stream_options", self._generate_stream_options)
        events = self._generate(session_id, prompt_ids, params, **options)
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

    def _fits_one_message(self, params: generation_pb2.SamplingParams | None) -> bool:
        """Whether generate()'s grouped stream would carry this request's every token in its final message."""
        return (
            self.config.unary_generate
            and params is not None
            and params.HasField("max_new_tokens")
            and params.max_new_tokens <= self.config.generate_chunk_tokens
        )

    def stream(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        params: generation_pb2.SamplingParams | None = None,
        *,
        structured_output: generation_pb2.StructuredOutput | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
        request_id: str | None = None,
        stream_options: generation_pb2.StreamOptions | None = None,
    ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Yield TokenChunks as they arrive, then one GenerateResult.

        ``stream_options`` groups tokens into fewer messages (unset: every token as decoded); tokens the server
        sent with its final message are yielded as one last chunk before the result.

        Raises RequestError for a request the engine refuses (never retried), InfrastructureError when no
        server could finish it (servers down, retries exhausted, deadline passed).
        """
        return self._generate(
            session_id, prompt_ids, params, structured_output=structured_output, priority=priority,
            timeout_s=timeout_s, request_id=request_id, stream_options=stream_options,
        )

    async def _generate_unary(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        params: generation_pb2.SamplingParams,
        *,
        structured_output: generation_pb2.StructuredOutput | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> GenerateResult:
        """generate() of a request whose every token comes in one message: each attempt is one GenerateUnary call.

        A coroutine rather than ``_generate``'s generator, which costs such a short call more client CPU.
        A failed attempt delivered nothing, so every attempt sends the same request under its own id, and nothing
        is ever resumed.
        """
        started = time.monotonic()
        deadline = started + (timeout_s or self.config.generate_timeout_s)
        base_id = request_id or self._new_request_id()
        prompt = self._prompts.pack(session_id, prompt_ids)
        unary_request = generation_pb2.GenerateUnaryRequest()
        request = unary_request.request
        attempt_request(base_id, session_id, prompt, params, 0, structured_output, priority, None, into=request)
        servers: list[str] = []
        failed: set[str] = set()
        for attempt in range(1, self.config.max_attempts + 1):
            endpoint = await self._pick(session_id, deadline, avoid=failed)
            attempt_id = base_id if attempt == 1 else f"{base_id}.{attempt}"
            request.request_id = attempt_id
            servers.append(endpoint.address)
            await endpoint.stream_slots.acquire()  # bounded calls per channel: beyond, requests wait here
            call = endpoint.generate.GenerateUnary(unary_request, timeout=max(0.001, deadline - time.monotonic()))
            self._begin_attempt(endpoint, session_id, attempt_id, call, unary=True)
            response = None
            try:
                response = await call
            except grpc.aio.AioRpcError as error:
                self._attempt_failed(error, endpoint, base_id, attempt, deadline, failed, resumed=False)
            except asyncio.CancelledError:  # the server stopped answering and its calls were cancelled: fail over
                if not endpoint.abandoned(call):
                    raise
                self._attempt_failed(endpoint.hung_error(), endpoint, base_id, attempt, deadline, failed, resumed=False)
            finally:
                self._end_attempt(endpoint, session_id, attempt_id, call, finished=response is not None)
            if response is not None:
                break
            await self._backoff(attempt)
        else:
            raise InfrastructureError(f"generate {base_id} exhausted its attempts")
        complete = response.complete
        self._versions.advance(endpoint.address, complete.weight_version)
        received = Received()
        for chunk in response.chunks:
            received.add_proto(chunk)
        if complete.tokens.token_ids:
            received.add_proto(complete.tokens)
        if response.chunks or complete.tokens.token_ids:
            self.metrics.first_token_seconds.observe(time.monotonic() - started)
        return self._result(
            base_id, session_id, received, complete, prompt_length(prompt), complete.cached_prompt_tokens, servers,
            0, started,
        )

    async def _generate(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        params: generation_pb2.SamplingParams | None,
        *,
        structured_output: generation_pb2.StructuredOutput | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
        request_id: str | None = None,
        stream_options: generation_pb2.StreamOptions | None = None,
    ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """``stream``'s generator (and generate()'s for a budget beyond one message)."""
        started = time.monotonic()
        deadline = started + (timeout_s or self.config.generate_timeout_s)
        base_id = request_id or self._new_request_id()
        params = params or generation_pb2.SamplingParams()
        prompt = self._prompts.pack(session_id, prompt_ids)
        received = Received()
        tokens = received.token_ids
        servers: list[str] = []
        cached = 0
        failovers = 0
        failed: set[str] = set()
        first_token_seen = False

        def absorb(message: generation_pb2.TokenChunk) -> TokenChunk:
            """Add a received chunk to the result (every attempt's tokens, in order)."""
            nonlocal first_token_seen
            chunk = wire.chunk_from_proto(message)
            received.add(chunk)
            if not first_token_seen:
                first_token_seen = True
                self.metrics.first_token_seconds.observe(time.monotonic() - started)
            return chunk

        for attempt in range(1, self.config.max_attempts + 1):
            endpoint = await self._pick(session_id, deadline, avoid=failed)
            ended = ended_before_resume(tokens, params, endpoint) if attempt > 1 else None
            if ended is not None:  # the lost stream had in fact finished: only its final message was missing
                reason, matched = ended
                complete = generation_pb2.GenerateComplete(finish_reason=wire.FINISH_REASONS[reason])
                if matched is not None:
                    complete.matched_stop_token_id = matched
                break
            attempt_id = base_id if attempt == 1 else f"{base_id}.{attempt}"
            request = attempt_request(
                attempt_id, session_id, extended(prompt, tokens), params, len(tokens), structured_output, priority,
                stream_options,
            )
            servers.append(endpoint.address)
            await endpoint.stream_slots.acquire()  # bounded calls per channel: beyond, requests wait here
            call = endpoint.generate.Generate(request, timeout=max(0.001, deadline - time.monotonic()))
            self._begin_attempt(endpoint, session_id, attempt_id, call, unary=False)
            complete = None
            try:
                # read() rather than ``async for``: one async-generator layer less per message
                while (message := await call.read()) is not grpc.aio.EOF:
                    if message.HasField("complete"):
                        complete = message.complete
                        if complete.tokens.token_ids:  # tokens grouped into the final message
                            yield absorb(complete.tokens)
                        break
                    yield absorb(message.chunk)
                if complete is None:
                    raise InfrastructureError(f"{endpoint.address} ended the stream of {attempt_id} without a result")
            except grpc.aio.AioRpcError as error:
                failovers += self._attempt_failed(error, endpoint, base_id, attempt, deadline, failed, bool(tokens))
            except asyncio.CancelledError:  # the server stopped answering and its calls were cancelled: fail over
                if not endpoint.abandoned(call):
                    raise
                hung = endpoint.hung_error()
                failovers += self._attempt_failed(hung, endpoint, base_id, attempt, deadline, failed, bool(tokens))
            finally:
                self._end_attempt(endpoint, session_id, attempt_id, call, finished=complete is not None)
            if complete is not None:
                cached += complete.cached_prompt_tokens
                self._versions.advance(endpoint.address, complete.weight_version)
                break
            await self._backoff(attempt)
        else:
            raise InfrastructureError(f"generate {base_id} exhausted its attempts")
        yield self._result(
            base_id, session_id, received, complete, prompt_length(prompt), cached, servers, failovers, started
        )

    def _new_request_id(self) -> str:
        """This Router's random prefix and a counter: unique across Routers and processes as a uuid4 per call
        would be, for a fraction of its cost."""
        return f"{self._request_id_prefix}-{next(self._request_counter)}"

    def _begin_attempt(
        self, endpoint: Endpoint, session_id: str, attempt_id: str, call: grpc.aio.Call, unary: bool
    ) -> None:
        """An attempt holding one of the endpoint's call slots has started ``call``."""
        endpoint.begin_request(call)
        self._active.setdefault(session_id, {})[attempt_id] = endpoint
        self._attempt_counters[unary].inc()

    def _end_attempt(
        self, endpoint: Endpoint, session_id: str, attempt_id: str, call: grpc.aio.Call, finished: bool
    ) -> None:
        """An attempt is over (finished, failed, cancelled or closed early): free its slot, and free the engine of
        it unless it finished."""
        endpoint.stream_slots.release()
        endpoint.end_request(call)
        active = self._active.get(session_id, {})
        active.pop(attempt_id, None)
        if not active:
            self._active.pop(session_id, None)
        if not finished and not call.done():
            call.cancel()
            self._spawn(self._abort_on(endpoint, [attempt_id]))

    def _attempt_failed(
        self,
        error: grpc.aio.AioRpcError,
        endpoint: Endpoint,
        base_id: str,
        attempt: int,
        deadline: float,
        failed: set[str],
        resumed: bool,
    ) -> int:
        """Raise unless the failure is worth another attempt; the failovers it counts (1 when tokens had been
        received: the next attempt resumes from them)."""
        code = error.code()
        if code not in _RETRYABLE:
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise InfrastructureError(f"generate {base_id} exceeded its deadline") from error
            raise RequestError(code, error.details() or "", endpoint.address) from error
        self.metrics.retries.labels(code.name).inc()
        failed.add(endpoint.address)
        if code == grpc.StatusCode.UNAVAILABLE:
            endpoint.mark_unavailable()
        if resumed:
            self.metrics.failovers.inc()
        log.warning("generate %s: %s from %s (attempt %d)", base_id, code.name, endpoint.address, attempt)
        if attempt == self.config.max_attempts or time.monotonic() >= deadline:
            raise InfrastructureError(
                f"generate {base_id} failed on {attempt} attempts; last: {code.name} from {endpoint.address}"
            ) from error
        return int(resumed)

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (attempt - 1)))

    def _result(
        self,
        base_id: str,
        session_id: str,
        received: Received,
        complete: generation_pb2.GenerateComplete,
        prompt_tokens: int,
        cached: int,
        servers: list[str],
        failovers: int,
        started: float,
    ) -> GenerateResult:
        elapsed = time.monotonic() - started
        self.metrics.generate_seconds.observe(elapsed)
        return GenerateResult(
            request_id=base_id,
            session_id=session_id,
            token_ids=tuple(received.token_ids),
            logprobs=tuple(received.logprobs),
            top_logprobs=tuple(received.top_logprobs),
            weight_versions=tuple(received.weight_versions),
            finish_reason=wire.FINISH_REASONS_FROM_PROTO[complete.finish_reason],
            matched_stop_token_id=(
                complete.matched_stop_token_id if complete.HasField("matched_stop_token_id") else None
            ),
            prompt_tokens=prompt_tokens,
            cached_prompt_tokens=cached,
            servers=tuple(servers),
            failovers=failovers,
            seconds=elapsed,
        )

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_on(self, endpoint: Endpoint, request_ids: list[str]) -> None:
        try:
            await endpoint.generate.Abort(generation_pb2.AbortRequest(request_ids=request_ids), timeout=5)
        except grpc.aio.AioRpcError as error:  # the server is gone: nothing left to abort there
            log.debug("abort on %s failed: %s", endpoint.address, error.code().name)

    # -- abort -----------------------------------------------------------------------------------------------

    async def abort(self, session_id: str) -> FanOutResult:
        """Abort the session's in-flight requests; their streams end with FINISH_REASON_ABORT."""
        by_server: dict[str, list[str]] = {}
        for request_id, endpoint in self._active.get(session_id, {}).items():
            by_server.setdefault(endpoint.address, []).append(request_id)
        return await self._fan_out(
            lambda e: e.generate.Abort(
                generation_pb2.AbortRequest(request_ids=by_server[e.address]), timeout=self.config.control_timeout_s
            ),
            only=set(by_server),
        )

    async def abort_all(self) -> FanOutResult:
        """Abort every in-flight request on every server (other clients' too)."""
        return await self._fan_out(
            lambda e: e.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=self.config.control_timeout_s)
        )

    # -- fan-out control -------------------------------------------------------------------------------------

    async def _fan_out(
        self, call: Callable[[Endpoint], Awaitable[object]], only: set[str] | None = None
    ) -> FanOutResult:
        endpoints = [e for a, e in self._endpoints.items() if only is None or a in only]
        outcomes = await asyncio.gather(*(call(e) for e in endpoints), return_exceptions=True)
        result = FanOutResult()
        for endpoint, outcome in zip(endpoints, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                result.errors[endpoint.address] = outcome
            else:
                result.responses[endpoint.address] = outcome
        return result

    async def server_info(self) -> FanOutResult:
        result = await self._fan_out(
            lambda e: e.control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=self.config.control_timeout_s)
        )
        self._report_versions(result)
        return result

    async def sleep(self, level: int = engine_pb2.SLEEP_LEVEL_KV_CACHE) -> FanOutResult:
        return await self._fan_out(
            lambda e: e.control.Sleep(engine_pb2.SleepRequest(level=level), timeout=self.config.control_timeout_s)
        )

    async def wake_up(self, tags: Iterable[int] = ()) -> FanOutResult:
        return await self._fan_out(
            lambda e: e.control.WakeUp(engine_pb2.WakeUpRequest(tags=list(tags)), timeout=self.config.control_timeout_s)
        )

    async def pause(self, mode: int = engine_pb2.PAUSE_MODE_ABORT) -> FanOutResult:
        return await self._fan_out(
            lambda e: e.control.Pause(engine_pb2.PauseRequest(mode=mode), timeout=self.config.control_timeout_s)
        )

    async def resume(self) -> FanOutResult:
        return await self._fan_out(
            lambda e: e.control.Resume(engine_pb2.ResumeRequest(), timeout=self.config.control_timeout_s)
        )

    async def flush_cache(self) -> FanOutResult:
        return await self._fan_out(
            lambda e: e.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=self.config.control_timeout_s)
        )

    async def update_weights(
        self, tensors: Iterable[NamedTensor], weight_version: int | None = None, flush_cache: bool = True
    ) -> FanOutResult:
        """Stream the same tensors to every server concurrently; each applies them atomically on the commit. The
        version the servers answer becomes the fleet's: a server that missed it is held out until it has it."""
        messages = weight_update_messages(tensors, weight_version, flush_cache, self.config.weight_chunk_bytes)

        async def send(endpoint: Endpoint):
            async def stream():
                for message in messages:
                    yield message

            return await endpoint.control.UpdateWeights(stream(), timeout=self.config.control_timeout_s)

        result = await self._fan_out(send)
        self._report_versions(result)
        return result

    def _report_versions(self, result: FanOutResult) -> None:
        """Record the weight versions in the answers of a fan-out (GetServerInfo, UpdateWeights)."""
        for address, response in result.responses.items():
            if address in self._endpoints:
                self._versions.report(address, response.weight_version)


def discovery_addresses(path: str | Path) -> list[str]:
    """The addresses in a launcher's discovery file: ``{"servers": [{"address": "host:port", ...}, ...]}``."""
    document = json.loads(Path(path).read_text())
    return [entry["address"] for entry in document["servers"]]


def discovery_security(path: str | Path) -> ClientSecurity | None:
    """How to reach a discovery file's servers (its optional ``security``: paths and variable names only)."""
    document = json.loads(Path(path).read_text())
    return ClientSecurity.model_validate(document["security"]) if document.get("security") else None

