"""ExternalAgents: a dataset played by agents of your own (unmodified: the OpenAI or Anthropic SDK, a CLI harness)
through the session gateway, one session per sample, their trajectories the same type as our loops'.

Each sample: (1) a session is created with the sample's id, GRPO group, ground truth and dataset row, and a key
that opens that session's model routes and its reward route alone (``SessionKeys``); (2) its agent runs, bounded
by ``timeout_s``, at most ``max_concurrency`` at once: a Python function called as ``fn(base_url=..., api_key=...,
row=..., session_id=...)`` (async, or sync in a thread of its own), or a command started per session with the
session's URLs and key in its environment (``agent_environment``), its output in a log file per session, its
process group killed on timeout; (3) a timed-out or crashed agent fails its session's chains as an infrastructure
failure (never trained on; the cause names the timeout, the exit code or the exception); (4) the session is
finished: one trajectory per chain (forks after their main chain; ``select`` keeps all, the longest or the last),
rewarded with what the agent posted to its reward route (``posted_reward``), else the gateway's reward function. A
function's result (a mapping of strings), or the metadata of the AgentProgramError it raised, becomes the
``metadata`` of its session's trajectories.

A session with no chain at all gives one failed trajectory, an infrastructure failure too: whether its agent
crashed before asking anything or ended without calling the model, no token of it is the model's, so there is
nothing to train on and the model is not to blame (the error says which it was).

The keys: the gateway's app is locked with a token only this process knows; an agent gets a key per session,
valid while its agent runs, which the middleware of ``SessionKeys.install`` swaps for that token on
``/sessions/{id}/v1/...`` and ``/sessions/{id}/reward`` of its own session only. An agent can neither list, read,
finish nor talk into another session, nor create one, and a straggler (a hung thread past its timeout) is refused
once its session is finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import inspect
import json
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentloop_grpc.agent.sample import Sample
from agentloop_grpc.agent.trajectory import Trajectory
from agentloop_grpc.agent.worker import failed_trajectory

from .chain import LOOP
from .exchange import GatewayError
from .service import SessionGateway
from .sessions import SessionSpec

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

#: The routes a session's key opens: its own model routes and its reward route.
_SCOPED = re.compile(r"^/sessions/([^/]+)/(?:v1/.*|reward)$")


@dataclass(frozen=True, slots=True)
class AgentFailure:
    """Why an agent's session failed: ``cause`` for counting (``agent_timeout``, ``agent_raised``,
    ``agent_exited``), ``message`` for people."""

    cause: str
    message: str


class AgentProgramError(Exception):
    """What an agent function raises to say itself why its session failed: ``cause`` is counted as the failure's
    cause, the message is its error (an environment that plays sessions names what of it failed); ``metadata``
    goes to its trajectories."""

    def __init__(self, cause: str, message: str, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.metadata = dict(metadata or {})


#: Which chains of a session are kept: every one, the one with the most tokens, or the last one started.
ChainSelection = Literal["all", "longest", "last"]


@dataclass(frozen=True, slots=True)
class AgentProgram:
    """What plays a session: exactly one of a Python function and a command line."""

    function: Callable[..., Any] | None = None
    command: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.function is None) == (not self.command):
            raise ValueError("an agent program is exactly one of a function and a command")


class SessionKeys:
    """One key per running session, opening that session's model and reward routes alone (see the module
    docstring); ``inner_token`` is the app's own token, which no agent sees."""

    def __init__(self, inner_token: str) -> None:
        self._inner = f"Bearer {inner_token}".encode()
        self._keys: dict[str, str] = {}

    def grant(self, session_id: str) -> str:
        key = secrets.token_urlsafe(24)
        self._keys[session_id] = key
        return key

    def revoke(self, session_id: str) -> None:
        self._keys.pop(session_id, None)

    def install(self, app: FastAPI) -> None:
        """Put the key check in front of ``app`` (before it serves)."""
        app.add_middleware(_ScopedKeys, keys=self)

    def admit(self, scope: Scope) -> Scope:
        """``scope`` with the app's token in place of a session's key on that session's routes; anything else
        unchanged (the app then refuses what carries no app token)."""
        found = _SCOPED.match(scope.get("path", ""))
        key = self._keys.get(found.group(1)) if found else None
        if key is None:
            return scope
        headers = [(name, value) for name, value in scope.get("headers", [])]
        sent = _sent_key(headers)
        if sent is None or not hmac.compare_digest(sent.encode(), key.encode()):
            return scope
        kept = [(n, v) for n, v in headers if n.lower() not in (b"authorization", b"x-api-key")]
        return {**scope, "headers": [*kept, (b"authorization", self._inner)]}


class _ScopedKeys:
    def __init__(self, app: ASGIApp, keys: SessionKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(self.keys.admit(scope) if scope["type"] == "http" else scope, receive, send)


def _sent_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].decode("latin-1").strip()
    for name, value in headers:
        if name.lower() == b"x-api-key":
            return value.decode("latin-1")
    return None


def agent_environment(url: str, session_id: str, key: str, row: Mapping[str, Any]) -> dict[str, str]:
    """What a command agent finds in its environment (beside this process's own)."""
    base = f"{url}/sessions/{session_id}"
    return {
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": base,  # Anthropic's SDK adds /v1/messages itself
        "ANTHROPIC_API_KEY": key,
        "AGENTLOOP_SESSION_ID": session_id,
        "AGENTLOOP_REWARD_URL": f"{base}/reward",
        "AGENTLOOP_ROW": json.dumps(row, default=str),
    }


def session_id_of(index: int, sample: Sample) -> str:
    """A session id for the ``index``-th sample: unique in the run, readable, a valid URL path segment."""
    return f"{index}-{re.sub(r'[^A-Za-z0-9._-]', '_', sample.sample_id)}"[:128]


class ExternalAgents:
    """Plays samples as gateway sessions with an ``AgentProgram`` (see the module docstring).

    ``url``: the gateway's base URL (its app locked by ``keys``); ``log_dir``: where a command's output goes, one
    file per session (None: discarded); ``posted_reward``: False drops what an agent posted, so the gateway's
    reward function scores every chain."""

    def __init__(self, gateway: SessionGateway, url: str, keys: SessionKeys, program: AgentProgram, *,
                 max_concurrency: int = 32, timeout_s: float = 600.0, log_dir: Path | None = None,
                 posted_reward: bool = True, select: ChainSelection = "all") -> None:
        if max_concurrency < 1 or timeout_s <= 0:
            raise ValueError("max_concurrency must be >= 1 and timeout_s > 0")
        self.gateway = gateway
        self.url = url
        self.keys = keys
        self.program = program
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.log_dir = log_dir
        self.posted_reward = posted_reward
        self.select = select

    async def run(self, samples: Sequence[Sample], rows: Sequence[Mapping[str, Any]] | None = None,
                  on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Every sample's trajectories in the samples' order (``rows``: what each agent gets as its row, aligned
        with ``samples``; None: the sample's fields). ``on_done`` gets each trajectory as its session ends."""
        if rows is not None and len(rows) != len(samples):
            raise ValueError(f"{len(rows)} rows for {len(samples)} samples")
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        slots = asyncio.Semaphore(self.max_concurrency)

        async def one(index: int, sample: Sample) -> list[Trajectory]:
            async with slots:
                row = dict(rows[index]) if rows is not None else sample.model_dump(mode="json")
                trajectories = await self.play(session_id_of(index, sample), sample, row)
            for trajectory in trajectories:
                if on_done is not None:
                    on_done(trajectory)
            return trajectories

        played = await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))
        return [t for trajectories in played for t in trajectories]

    async def play(self, session_id: str, sample: Sample, row: dict[str, Any]) -> list[Trajectory]:
        """One sample as the session ``session_id``: its trajectories, one per chain (a failed one without)."""
        # 1. the session and its key
        try:
            self.gateway.create(SessionSpec(session_id=session_id, sample_id=sample.sample_id,
                                            group_id=sample.group_id, ground_truth=sample.ground_truth, row=row))
        except (GatewayError, ValueError) as error:  # a full table, a ground truth too long for a session
            return [self._failed(sample, f"the session could not be created: {error}", "gateway_session")]
        key = self.keys.grant(session_id)
        # 2. the agent
        metadata: dict[str, str] = {}
        try:
            failure = await self._agent(session_id, key, row, metadata)
        finally:
            self.keys.revoke(session_id)
        # 3-4. a crash fails the chains; the trajectories
        played = await self._finish(session_id, sample, failure)
        return [dataclasses.replace(t, metadata=metadata) for t in played] if metadata else played

    async def _agent(self, session_id: str, key: str, row: dict[str, Any],
                     metadata: dict[str, str]) -> AgentFailure | None:
        """Run the agent; None when it ended by itself, else why it failed (what it tells goes to ``metadata``)."""
        timer = asyncio.timeout(self.timeout_s)
        try:
            async with timer:
                if self.program.function is not None:
                    told = await self._call(self.program.function, {
                        "base_url": f"{self.url}/sessions/{session_id}/v1", "api_key": key, "row": row,
                        "session_id": session_id})
                    if isinstance(told, Mapping):
                        metadata.update({str(k): str(v) for k, v in told.items()})
                    return None
                return await self._spawn(session_id, agent_environment(self.url, session_id, key, row))
        except AgentProgramError as error:  # the program named what failed: counted under its cause
            metadata.update(error.metadata)
            return AgentFailure(error.cause, str(error))
        except TimeoutError as error:
            if timer.expired():
                return AgentFailure("agent_timeout", f"the agent ran past timeout_s={self.timeout_s:g} and was stopped")
            return AgentFailure("agent_raised", f"the agent raised {type(error).__name__}: {error}")
        except Exception as error:  # noqa: BLE001 - an agent's code may raise anything: its session fails alone
            return AgentFailure("agent_raised", f"the agent raised {type(error).__name__}: {error}")

    @staticmethod
    async def _call(function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(function):
            return await function(**kwargs)
        result = await _in_thread(function, kwargs)
        if inspect.isawaitable(result):
            return await result
        return result

    async def _spawn(self, session_id: str, env: dict[str, str]) -> AgentFailure | None:
        log = self.log_dir / f"{session_id}.log" if self.log_dir is not None else None
        sink = await asyncio.to_thread(open, log, "wb") if log is not None else subprocess.DEVNULL
        try:
            process = await asyncio.create_subprocess_exec(
                *self.program.command, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,  # its own process group: what it starts dies with it
            )
            try:
                code = await process.wait()
            finally:
                _kill_group(process.pid)  # on timeout or cancel; after an exit, whatever it left running
                if process.returncode is None:
                    await process.wait()
        finally:
            if not isinstance(sink, int):
                sink.close()
        if code == 0:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return AgentFailure("agent_exited", f"the agent {how}" + (f" (its log: {log})" if log is not None else ""))

    async def _finish(self, session_id: str, sample: Sample, failure: AgentFailure | None) -> list[Trajectory]:
        try:
            session = self.gateway.sessions.get(session_id)
            # a turn the agent left in flight (cancelled, timed out) ends within the turn's deadline
            deadline = asyncio.get_running_loop().time() + self.gateway.config.generate_timeout_s
            while session.in_flight and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - no event
                await asyncio.sleep(0.02)
            # from here to finish's pop nothing awaits: no request slips in between
            if failure is not None:
                self.gateway.fail(session_id, failure.message, failure.cause)
            if not self.posted_reward:
                session.reward, session.reward_metrics = None, {}
            _, trajectories = await self.gateway.finish(session_id)
        except GatewayError as error:  # expired (session_ttl_s), or a turn still in flight past its deadline
            return [self._failed(sample, f"the session could not be finished: {error}" +
                                 (f"; {failure.message}" if failure else ""), "gateway_session")]
        if trajectories:
            return _selected(trajectories, self.select)
        if failure is not None:
            return [self._failed(sample, f"{failure.message} before asking the model anything", failure.cause)]
        return [self._failed(sample, "the agent ended without asking the model anything", "agent_no_turn")]

    @staticmethod
    def _failed(sample: Sample, error: str, cause: str) -> Trajectory:
        return failed_trajectory(sample.model_copy(update={"loop": LOOP}), error, infrastructure=True, cause=cause)


def _selected(trajectories: list[Trajectory], select: ChainSelection) -> list[Trajectory]:
    """The chains kept of a session's (in chain order: the last started is the last)."""
    if select == "all" or len(trajectories) == 1:
        return trajectories
    if select == "last":
        return trajectories[-1:]
    return [max(trajectories, key=lambda t: len(t.prompt_ids) + len(t.response_ids))]


async def _in_thread(function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``function(**kwargs)`` in a daemon thread of its own: a sync agent that hangs past its timeout cannot be
    stopped, but it holds no pool's worker and does not keep the process from exiting."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # timed out meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result, error = function(**kwargs), None
        except BaseException as raised:  # noqa: BLE001 - handed to the awaiting coroutine, which reports it
            # a SystemExit of the agent's fails its session, not this process
            result, error = None, raised if isinstance(raised, Exception) else RuntimeError(repr(raised))
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="agentloop-agent", daemon=True).start()
    return await done


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
