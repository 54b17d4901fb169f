"""MCP servers as tools of a ToolExecute server: ``McpServer`` (one configured server: its tools, its sessions)
and ``McpTool`` (one of its tools under the Tool protocol).

Each trajectory holds its own session with the server, opened by its first CreateInstance of any of the server's
tools and closed when its last instance is released. For a command that is its own server process in a world of
its own (``mcp_world.py``: a fresh folder as working directory, HOME, TMPDIR and XDG folders, and by default a
bubblewrap jail in which nothing else is writable), so state (files, a browser, a counter) never leaks between
trajectories; the folder goes with the session, and with every session when the tool server stops. ``shared:
true`` gives every trajectory one session instead, its process started as configured (no folder, no sandbox),
reopened for new instances once it failed. The server's tools are listed once at start-up, by a process in a world
like a trajectory's (a server that cannot start then is a start-up error), and appear in ListTools with their own
input schemas, optionally renamed with a prefix.

Results: text parts are joined as the text the model reads; images become the result's images; structured
content stands in for the text when a result has no text; an embedded text resource is text, and other parts
(audio, blobs, resource links) are named in the text. ``is_error`` is a tool error the model reads; arguments the
server refuses as invalid params are an INVALID_ARGUMENTS tool error. Text beyond ``max_output_bytes`` is cut (the
model reads that it was) and images beyond it are left out. A server that crashes, hangs or does not start raises
``ToolBackendError`` (``mcp_connection.py``): an infrastructure failure of the trajectories it served.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from dataclasses import dataclass
from typing import Any

from mcp import types

from agentloop_grpc.common.jail import probe_cached

from .mcp_config import McpServerEntry
from .mcp_connection import InvalidParamsError, McpConnection
from .mcp_world import make_world, sandbox_hint, unsandboxed_warning
from .result import RewardResult, ToolErrorKind, ToolImage, ToolResult, ToolSpec

log = logging.getLogger(__name__)


@dataclass
class _Session:
    connection: McpConnection
    users: int = 0


class McpServer:
    """One configured MCP server: the connections of its trajectories (or its one shared connection)."""

    def __init__(self, entry: McpServerEntry) -> None:
        self.entry = entry
        self._sessions: dict[str, asyncio.Task[_Session]] = {}
        self._warned = False

    @property
    def jailed(self) -> bool:
        """Whether each trajectory's process runs in a bubblewrap jail (its entry asks for it and bwrap works)."""
        return self.entry.per_trajectory and self.entry.sandbox and probe_cached() is None

    def _warn_unsandboxed(self) -> None:
        e = self.entry
        if self._warned or not e.per_trajectory or self.jailed:
            return
        self._warned = True
        log.warning(unsandboxed_warning(e, probe_cached() or "bwrap cannot run here" if e.sandbox
                                        else "sandbox: false"))

    def _connection(self) -> McpConnection:
        e = self.entry
        if not e.per_trajectory:
            return McpConnection(e.name, command=e.command, url=e.url, env=e.env, cwd=e.cwd, headers=e.headers,
                                 start_timeout_s=e.start_timeout_s, call_timeout_s=e.call_timeout_s)
        jailed = self.jailed
        world = make_world(e, jailed)
        return McpConnection(e.name, command=world.argv, env=world.env, cwd=world.cwd,
                             start_timeout_s=e.start_timeout_s, call_timeout_s=e.call_timeout_s,
                             cleanup=world.remove, start_hint=sandbox_hint(e) if jailed else "")

    async def tools(self) -> list[McpTool]:
        """The server's tools (those ``tools`` names, when given), from a connection opened for the listing."""
        if self.entry.per_trajectory and self.entry.sandbox:
            await asyncio.to_thread(probe_cached)  # once per process: it starts a jail
        self._warn_unsandboxed()
        connection = self._connection()
        await connection.open()
        try:
            listed = await connection.list_tools()
        finally:
            await connection.close()
        wanted = self.entry.tools
        if wanted is not None:
            missing = sorted(set(wanted) - {t.name for t in listed})
            if missing:
                raise ValueError(f"MCP server {self.entry.name!r} has no tools named {missing}; it offers "
                                 f"{sorted(t.name for t in listed)}")
        return [McpTool(self, tool) for tool in listed if wanted is None or tool.name in wanted]

    async def _open(self) -> _Session:
        connection = self._connection()
        await connection.open()
        return _Session(connection)

    async def acquire(self, trajectory_id: str) -> tuple[str, McpConnection]:
        """A session for ``trajectory_id`` (its own, or the shared one), opened if needed: its key and connection."""
        key = "" if self.entry.shared else trajectory_id
        task = self._sessions.get(key)
        if task is not None and task.done() and (task.cancelled() or task.exception() is not None
                                                 or not task.result().connection.usable):
            task = None  # a session that failed is reopened for new instances, never reused
        if task is None:
            task = asyncio.create_task(self._open(), name=f"mcp-open-{self.entry.name}")
            self._sessions[key] = task
        try:
            session = await asyncio.shield(task)
        except BaseException:
            if self._sessions.get(key) is task:
                del self._sessions[key]
            raise
        session.users += 1
        return key, session.connection

    async def release(self, key: str, connection: McpConnection) -> None:
        """One instance less on the session of ``key``; the last one closes it (a shared session stays open)."""
        task = self._sessions.get(key)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            await connection.close()
            return
        session = task.result()
        if session.connection is not connection:  # the session was reopened since: this instance's is done
            await connection.close()
            return
        session.users -= 1
        if session.users <= 0 and not self.entry.shared:
            del self._sessions[key]
            await connection.close()

    async def close(self) -> None:
        """Close every session (at once: each may wait seconds for its server to stop), folders removed."""
        tasks, self._sessions = list(self._sessions.values()), {}

        async def end(task: asyncio.Task[_Session]) -> None:
            if not task.done():
                task.cancel()
            try:
                session = await task
            except BaseException:  # noqa: BLE001 - a session that never opened has nothing to close
                return
            await session.connection.close()

        await asyncio.gather(*(end(task) for task in tasks))


@dataclass(frozen=True)
class _Instance:
    key: str
    connection: McpConnection


class McpTool:
    """One tool of an MCP server under the Tool protocol; an instance is a hold on its trajectory's session."""

    def __init__(self, server: McpServer, tool: types.Tool) -> None:
        self._server, self._name = server, tool.name
        self.spec = ToolSpec(name=server.entry.prefix + tool.name, description=tool.description or "",
                             parameters=dict(tool.input_schema))

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> _Instance:
        if kwargs:
            raise ValueError(f"MCP tool {self.spec.name!r} takes no creation arguments, got {sorted(kwargs)}")
        return _Instance(*await self._server.acquire(trajectory_id))

    async def execute(self, state: _Instance, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await state.connection.call(self._name, arguments)
        except InvalidParamsError as error:
            return ToolResult.error(ToolErrorKind.INVALID_ARGUMENTS, f"invalid arguments for {self.spec.name}: "
                                                                     f"{error}")
        return to_tool_result(result, self._server.entry.max_output_bytes)

    async def reward(self, state: _Instance) -> RewardResult:
        return RewardResult(0.0)

    async def release(self, state: _Instance) -> None:
        await self._server.release(state.key, state.connection)

    async def close(self) -> None:
        await self._server.close()


def to_tool_result(result: types.CallToolResult, max_output_bytes: int) -> ToolResult:
    """An MCP tool result as what the model reads (see the module docstring)."""
    texts: list[str] = []
    images: list[ToolImage] = []
    budget = max_output_bytes
    for part in result.content:
        if isinstance(part, types.TextContent):
            texts.append(part.text)
        elif isinstance(part, types.ImageContent):
            try:
                data = base64.b64decode(part.data, validate=True)
            except (binascii.Error, ValueError):
                texts.append(f"[an image the server sent was not valid base64 ({part.mime_type})]")
                continue
            if len(data) > budget:
                texts.append(f"[an image of {len(data)} bytes was left out: over max_output_bytes]")
                continue
            budget -= len(data)
            images.append(ToolImage(part.mime_type, data))
        elif isinstance(part, types.EmbeddedResource) and isinstance(part.resource, types.TextResourceContents):
            texts.append(part.resource.text)
        elif isinstance(part, types.EmbeddedResource):
            texts.append(f"[resource {part.resource.uri} ({part.resource.mime_type or 'binary'})]")
        elif isinstance(part, types.ResourceLink):
            texts.append(f"[resource link {part.uri}: {part.name}]")
        elif isinstance(part, types.AudioContent):
            texts.append(f"[audio ({part.mime_type}) not shown]")
        else:
            texts.append(f"[{part.type} content not shown]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = _cut("\n".join(texts), budget)
    if result.is_error:
        return ToolResult(content=text, error_kind=ToolErrorKind.EXCEPTION, images=tuple(images))
    return ToolResult(content=text, images=tuple(images))


def _cut(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode(errors="ignore") + f"\n[output truncated: {len(data)} bytes, {max_bytes} kept]"
