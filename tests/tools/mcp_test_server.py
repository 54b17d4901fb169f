"""An MCP server written with the ``mcp`` SDK for the MCP tool tests: state per process, its pid, a slow call,
a failing call and a large output. ``python mcp_test_server.py`` serves stdio; ``--http`` serves streamable HTTP
on a free loopback port and prints ``PORT <n>`` once it listens.

With ``MCP_TEST_MARK_DIR`` set, ``slow`` marks its call there (a file named by the pid) before it waits. With
``MCP_TEST_HANG_FILE`` set, a start while that file exists hangs before the handshake (a server that never
starts, after the tool server listed its tools)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentloop-test")
#: Calls of ``counter`` in this process (over stdio, one process serves one session).
calls = [0]


@server.tool()
def counter() -> int:
    """Count this server process's calls (1 on the first)."""
    calls[0] += 1
    return calls[0]


@server.tool()
def pid() -> int:
    """The server process's id."""
    return os.getpid()


@server.tool()
async def slow(seconds: float) -> str:
    """Wait ``seconds``, then answer."""
    marks = os.environ.get("MCP_TEST_MARK_DIR")
    if marks:  # the test learns that this process's call is in flight
        with open(os.path.join(marks, str(os.getpid())), "w"):
            pass
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def fail(message: str) -> str:
    """Raise with ``message`` (the model reads it as the tool's error)."""
    raise ToolError(message)


@server.tool()
def big(size: int) -> str:
    """``size`` characters of text."""
    return "x" * size


def main() -> None:
    hang = os.environ.get("MCP_TEST_HANG_FILE")
    if hang and os.path.exists(hang):
        time.sleep(3600)
    if "--http" not in sys.argv:
        server.run()
        return
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(f"PORT {listener.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))


if __name__ == "__main__":
    main()
