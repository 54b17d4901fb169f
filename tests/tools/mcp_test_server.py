"""An MCP server written with the ``mcp`` SDK for the MCP tool tests: state per process, its pid, a slow call,
a failing call, a large output, where it runs (working directory, environment, arguments) and files it writes and
reads where it is told. ``python mcp_test_server.py`` serves stdio; ``--http`` serves streamable HTTP
on a free loopback port and prints ``PORT <n>`` once it listens.

With ``MCP_TEST_MARK_DIR`` set, ``slow`` marks its call there (a file named by the pid) before it waits. With
``MCP_TEST_HANG_FILE`` set, a start while that file exists hangs before the handshake (a server that never
starts, after the tool server listed its tools)."""

from __future__ import annotations

import asyncio
import json
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


@server.tool()
def where() -> str:
    """This process's working directory, arguments and the environment variables that place its files (JSON)."""
    names = ("HOME", "TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
             "XDG_RUNTIME_DIR", "MCP_TEST_NOTE")
    return json.dumps({"cwd": os.getcwd(), "argv": sys.argv, "env": {n: os.environ.get(n) for n in names}})


@server.tool()
def write_file(path: str, text: str) -> str:
    """Write ``text`` to ``path`` (relative: to the working directory)."""
    try:
        with open(path, "w") as file:
            file.write(text)
    except OSError as error:  # said to the model (the SDK hides an unexpected exception's text)
        raise ToolError(str(error)) from None
    return "written"


@server.tool()
def read_file(path: str) -> str:
    """The text of ``path``, or "absent" when there is none."""
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        return "absent"
    except OSError as error:
        raise ToolError(str(error)) from None


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
