"""InstanceManager: the lifecycle of tool instances, shared by the gRPC servicer and the in-process client.

Instances live for a trajectory; each runs one call at a time (a Python session is not re-entrant). At most
``max_concurrent_executions`` calls run at once and up to ``max_queued_executions`` more wait their turn, so a
burst of calls waits instead of failing; past both, and past ``max_instances`` live instances, the answer is
RESOURCE_EXHAUSTED rather than a queue without bound. An instance idle past its TTL is released, so a client that
died leaks nothing.

Requests are bad model or client output, never a server fault: ids longer than MAX_ID_BYTES and JSON the decoder
cannot take (nested past Python's recursion limit, integers past its digit limit) are INVALID_ARGUMENT, and error
messages quote at most QUOTE_CHARS of any input.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from .config import ToolLimits
from .errors import InvalidToolRequestError, ToolBackendError, ToolNotFoundError, ToolServerFullError
from .result import LoopSnapshot, RewardResult, ToolErrorKind, ToolResult, ToolSpec, exception_result
from .tool import Tool

log = logging.getLogger(__name__)

MAX_ID_BYTES = 256
QUOTE_CHARS = 200


def _quote(text: str) -> str:
    """At most QUOTE_CHARS of ``text``: its start and, where a validator says what is wrong, its end."""
    if len(text) <= QUOTE_CHARS:
        return text
    tail = QUOTE_CHARS // 4
    return f"{text[:QUOTE_CHARS - tail]} ... {text[-tail:]}"


def _check_id(field: str, value: str) -> None:
    size = len(value.encode())
    if size > MAX_ID_BYTES:
        raise InvalidToolRequestError(f"{field} is {size} bytes (at most {MAX_ID_BYTES})")


def _decode(field: str, text: str) -> Any:
    """A JSON request field, or InvalidToolRequestError for anything Python's decoder cannot take."""
    try:
        return json.loads(text) if text else {}
    except RecursionError:
        raise InvalidToolRequestError(f"{field} nests deeper than the JSON decoder allows") from None
    except json.JSONDecodeError as error:
        raise InvalidToolRequestError(f"{field} is not JSON: {_quote(str(error))}") from None
    except ValueError:  # an integer literal past sys.get_int_max_str_digits()
        raise InvalidToolRequestError(
            f"{field} holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None


def loop_snapshot(trajectory_id: str, turn: int, messages_json: str) -> LoopSnapshot:
    """A request's loop_state as a LoopSnapshot, or InvalidToolRequestError naming the field that is wrong."""
    _check_id("loop_state.trajectory_id", trajectory_id)
    messages = _decode("loop_state.messages_json", messages_json or "[]")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidToolRequestError("loop_state.messages_json must be a JSON array of message objects")
    return LoopSnapshot(trajectory_id, turn, tuple(messages))


@dataclass
class _Instance:
    tool: Tool
    state: Any
    trajectory_id: str
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class InstanceManager:
    """Create / execute / reward / release tool instances within limits."""

    def __init__(self, tools: dict[str, Tool], limits: ToolLimits | None = None) -> None:
        self._tools = tools
        self._limits = limits or ToolLimits()
        self._instances: dict[str, _Instance] = {}
        self._slots = asyncio.Semaphore(self._limits.max_concurrent_executions)
        self._admitted = 0  # Execute calls past the admission check: running, or waiting for a slot or their instance
        self._running = 0
        self._reaper: asyncio.Task | None = None
        self._validators = {name: jsonschema.Draft202012Validator(t.spec.parameters) for name, t in tools.items()}

    def specs(self) -> list[ToolSpec]:
        return [self._tools[name].spec for name in sorted(self._tools)]

    @property
    def live_instances(self) -> int:
        return len(self._instances)

    @property
    def running_executions(self) -> int:
        return self._running

    @property
    def queued_executions(self) -> int:
        """Execute calls admitted and not yet running (waiting for a slot, or for their instance's last call)."""
        return self._admitted - self._running

    @property
    def limits(self) -> ToolLimits:
        return self._limits

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name="tool-instance-reaper")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        # at once: releasing an MCP session waits for its server to stop (seconds for one that ignores EOF), and a
        # launcher's grace period for the whole server is short
        await asyncio.gather(*(self.release(instance_id) for instance_id in list(self._instances)))
        for tool in self._tools.values():
            await tool.close()

    async def create(self, tool_name: str, trajectory_id: str, kwargs_json: str = "") -> str:
        _check_id("tool_name", tool_name)
        _check_id("trajectory_id", trajectory_id)
        tool = self._tools.get(tool_name)
        if tool is None:
            raise ToolNotFoundError(f"no tool named {tool_name!r}; hosted: {sorted(self._tools)}")
        if len(self._instances) >= self._limits.max_instances:
            raise ToolServerFullError(f"{self._limits.max_instances} tool instances are live (the limit)")
        kwargs = _decode("create_kwargs_json", kwargs_json)
        if not isinstance(kwargs, dict):
            raise InvalidToolRequestError("create_kwargs_json must be a JSON object")
        try:
            state = await tool.create(trajectory_id, kwargs)
        except (ValueError, TypeError, KeyError) as error:
            raise InvalidToolRequestError(
                f"tool {tool_name!r} rejected its creation arguments: {_quote(str(error))}"
            ) from error
        instance_id = f"{tool_name}-{uuid.uuid4().hex}"
        self._instances[instance_id] = _Instance(tool, state, trajectory_id, time.monotonic())
        return instance_id

    def _get(self, instance_id: str) -> _Instance:
        _check_id("instance_id", instance_id)
        instance = self._instances.get(instance_id)
        if instance is None:
            raise ToolNotFoundError(f"no tool instance {instance_id!r} (never created, released, or expired)")
        instance.last_used = time.monotonic()
        return instance

    async def execute(self, instance_id: str, arguments_json: str,
                      loop_state: LoopSnapshot | None = None, queue_wait_s: float | None = None) -> ToolResult:
        """Run one call; ``loop_state`` reaches only a tool whose spec wants it (which then needs it). A call that
        waits longer than ``queue_wait_s`` for a running place is refused as ToolServerFullError, having run
        nothing (the caller's deadline would pass in the queue)."""
        instance = self._get(instance_id)
        arguments = _decode("arguments_json", arguments_json)
        name = instance.tool.spec.name
        wants_state = instance.tool.spec.wants_loop_state
        if wants_state and loop_state is None:
            raise InvalidToolRequestError(f"loop_state: tool {name!r} asks for the loop's state and the call has none")
        problems = sorted(self._validators[name].iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            described = "; ".join(
                _quote(f"{'.'.join(map(str, p.path)) or 'arguments'}: {p.message}") for p in problems[:5]
            )
            return ToolResult.error(ToolErrorKind.INVALID_ARGUMENTS, f"invalid arguments for {name}: {described}")
        limits = self._limits
        if self._admitted >= limits.max_concurrent_executions + limits.max_queued_executions:
            raise ToolServerFullError(
                f"{self.running_executions} tool executions are running and {self.queued_executions} are queued "
                f"(the limits: {limits.max_concurrent_executions} and {limits.max_queued_executions})"
            )
        loop = asyncio.get_running_loop()
        give_up = None if queue_wait_s is None else loop.time() + queue_wait_s
        self._admitted += 1
        try:
            # the instance first: a call waiting behind its own instance's call holds no slot another could use
            async with instance.lock:
                await self._take_slot(give_up)
                self._running += 1
                started = time.monotonic()
                try:
                    if wants_state:
                        result = await instance.tool.execute(instance.state, arguments, loop_state=loop_state)
                    else:
                        result = await instance.tool.execute(instance.state, arguments)
                except ToolBackendError:  # what the tool depends on failed: the caller's infrastructure failure
                    raise
                except Exception as error:  # noqa: BLE001 - a tool's failure is the model's to read
                    result = exception_result(error)
                finally:
                    self._running -= 1
                    self._slots.release()
                result.metrics.setdefault("seconds", time.monotonic() - started)
        finally:
            self._admitted -= 1
            instance.last_used = time.monotonic()
        return result

    async def _take_slot(self, give_up: float | None) -> None:
        """A running place, or ToolServerFullError once the event loop's clock reaches ``give_up``."""
        try:
            async with asyncio.timeout_at(give_up):
                await self._slots.acquire()
        except TimeoutError:
            raise ToolServerFullError(
                f"waited in the queue for one of {self._limits.max_concurrent_executions} running tool executions "
                f"({self.queued_executions} queued) until the call's deadline was near"
            ) from None

    async def reward(self, instance_id: str) -> RewardResult:
        instance = self._get(instance_id)
        async with instance.lock:
            return await instance.tool.reward(instance.state)

    async def release(self, instance_id: str) -> None:
        _check_id("instance_id", instance_id)
        instance = self._instances.pop(instance_id, None)
        if instance is None:
            return
        async with instance.lock:
            try:
                await instance.tool.release(instance.state)
            except Exception:  # the instance is gone either way; keep the server up
                log.exception("releasing %s failed", instance_id)

    async def _reap(self) -> None:
        ttl = self._limits.instance_ttl_s
        while True:
            await asyncio.sleep(min(ttl / 4, 30.0))
            now = time.monotonic()
            for instance_id, instance in list(self._instances.items()):
                if now - instance.last_used > ttl and not instance.lock.locked():
                    log.info("releasing idle tool instance %s (TTL %.0f s)", instance_id, ttl)
                    await self.release(instance_id)
