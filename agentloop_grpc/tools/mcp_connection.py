"""McpConnection: one MCP client session with a server started as a command (stdio) or reached by URL
(streamable HTTP), with the limits a tool server needs: a start timeout, a call timeout, and every failure of the
server itself raised as ``ToolBackendError`` with its cause.

The MCP SDK's transports are anyio task groups, which must be left by the task that entered them, so a task of
the connection's own holds them from start to close; calls from any task go through the session it opened.

Causes (``ToolBackendError.cause``): ``mcp_server_not_started`` (the command could not be spawned, the URL not
reached, or the handshake not done within ``start_timeout_s``), ``mcp_server_crashed`` (the connection closed: the
process exited or was killed, the HTTP session ended), ``mcp_call_timeout`` (no answer within ``call_timeout_s``:
the connection is closed, since a server that hung once is not trusted with the next call), ``mcp_server_error``
(a JSON-RPC error other than invalid parameters: the server failed, not the tool's work), ``mcp_transport`` (any
other transport exception).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS

from .errors import ToolBackendError
from .mcp_world import program

log = logging.getLogger(__name__)

#: How long a closing connection may take to stop its server (stdin closed, then the SDK's terminate) before its
#: task is cancelled.
CLOSE_TIMEOUT_S = 10.0


class InvalidParamsError(Exception):
    """The server refused the call's arguments (JSON-RPC invalid params): the model's mistake, for it to read."""


class McpConnection:
    """A session with one MCP server (see the module docstring); ``label`` names it in errors."""

    def __init__(self, label: str, *, command: list[str] | None = None, url: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 headers: Mapping[str, str] | None = None, start_timeout_s: float = 30.0,
                 call_timeout_s: float = 60.0, cleanup: Callable[[], None] | None = None,
                 start_hint: str = "") -> None:
        """``cleanup`` runs (in a thread) once the connection closed and its server stopped (a per-trajectory
        server's folder is removed); ``start_hint`` is appended to a start-up failure's message."""
        if (command is None) == (url is None):
            raise ValueError("an MCP connection has exactly one of a command or a URL")
        self.label = label
        self._command, self._url = command, url
        self._env, self._cwd, self._headers = dict(env or {}), cwd, dict(headers or {})
        self._start_timeout_s, self._call_timeout_s = start_timeout_s, call_timeout_s
        self._cleanup, self._start_hint = cleanup, start_hint
        self._session: ClientSession | None = None
        self._holder: asyncio.Task | None = None
        self._closing = asyncio.Event()
        self._closed: asyncio.Future[None] | None = None
        #: Why the connection can take no more calls (None while it can).
        self.ended: str | None = None

    @property
    def usable(self) -> bool:
        return self._session is not None and self.ended is None

    async def _enter_transport(self, stack: contextlib.AsyncExitStack) -> Any:
        """The transport's (read, write) streams, entered on ``stack``. A URL's HTTP client is ours to close (the
        SDK closes only a client it made), after the transport's last request: one left to the garbage collector
        closes its sockets under connections the event loop still watches."""
        if self._command is not None:
            return await stack.enter_async_context(stdio_client(StdioServerParameters(
                command=program(self._command[0]), args=self._command[1:], env=self._env or None, cwd=self._cwd)))
        assert self._url is not None
        http = await stack.enter_async_context(create_mcp_http_client(headers=self._headers or None))
        return await stack.enter_async_context(streamable_http_client(self._url, http_client=http))

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._enter_transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self._session = session
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as error:  # noqa: BLE001 - the holder's end is recorded, never lost
            if not ready.done() and isinstance(error, Exception):
                ready.set_exception(error)
            elif not ready.done():  # cancelled while starting: open() has given up already
                ready.cancel()
            elif not self._closing.is_set():
                log.warning("MCP server %s: the connection ended: %r", self.label, error)
        finally:
            self._session = None
            self.ended = self.ended or "closed"

    async def open(self) -> None:
        """Start (or reach) the server and do the handshake within the start timeout."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(self._hold(ready), name=f"mcp-{self.label}")
        try:
            async with asyncio.timeout(self._start_timeout_s):
                await asyncio.shield(ready)
        except TimeoutError:
            await self.close()
            raise ToolBackendError("mcp_server_not_started", f"MCP server {self.label!r} did not finish its "
                                   f"handshake within start_timeout_s={self._start_timeout_s:g}"
                                   f"{self._start_hint}") from None
        except Exception as error:
            await self.close()
            raise ToolBackendError("mcp_server_not_started", f"MCP server {self.label!r} could not be started: "
                                   f"{type(error).__name__}: {error}{self._start_hint}") from error

    def _live_session(self, what: str) -> ClientSession:
        if self._session is None or self.ended is not None:
            raise ToolBackendError("mcp_server_crashed", f"MCP server {self.label!r}: no session for {what} "
                                   f"({self.ended or 'not started'})")
        return self._session

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server offers (all pages), within the call timeout."""
        session, tools, cursor = self._live_session("tools/list"), [], None
        async with asyncio.timeout(self._call_timeout_s):
            while True:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tools/call. The server's failures raise ToolBackendError (and end the connection); arguments it
        refuses raise InvalidParamsError; a result with ``is_error`` is returned as it is (the tool's work failed)."""
        session = self._live_session(f"a call of {tool}")
        try:
            async with asyncio.timeout(self._call_timeout_s):
                return await session.call_tool(tool, arguments)
        except TimeoutError:
            self.ended = f"{tool} timed out"
            await self.close()
            raise ToolBackendError("mcp_call_timeout", f"MCP server {self.label!r} did not answer {tool} within "
                                   f"call_timeout_s={self._call_timeout_s:g}; its connection was closed") from None
        except MCPError as error:
            if error.code == INVALID_PARAMS:
                raise InvalidParamsError(error.message) from None
            if error.code == CONNECTION_CLOSED:
                self.ended = f"the connection closed during {tool}"
                raise ToolBackendError("mcp_server_crashed", f"MCP server {self.label!r} closed the connection "
                                       f"during {tool} (it exited or was killed)") from None
            raise ToolBackendError("mcp_server_error", f"MCP server {self.label!r} answered {tool} with JSON-RPC "
                                   f"error {error.code}: {error.message}") from None
        except Exception as error:
            self.ended = f"{type(error).__name__} during {tool}"
            await self.close()
            raise ToolBackendError("mcp_transport", f"MCP server {self.label!r}: {type(error).__name__} during "
                                   f"{tool}: {error}") from error

    async def close(self) -> None:
        """End the session, stop a server this connection started, then run its cleanup; idempotent (a second
        call waits for the first's end)."""
        self.ended = self.ended or "closed"
        self._closing.set()
        if self._closed is None:
            holder, self._holder = self._holder, None
            self._closed = asyncio.ensure_future(self._finish(holder))
        await asyncio.shield(self._closed)

    async def _finish(self, holder: asyncio.Task | None) -> None:
        try:
            if holder is not None:
                if self._session is None:  # still starting (a hung handshake): nothing to wait for
                    holder.cancel()
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(holder)
                except TimeoutError:
                    holder.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await holder
        finally:
            cleanup, self._cleanup = self._cleanup, None
            if cleanup is not None:
                await asyncio.to_thread(cleanup)
