"""A stateful MCP server of the common kind: it keeps its notes in one file at a fixed absolute path (from
``MCP_NOTES_FILE``, as many servers take theirs from a variable; by default beside this script), not in its working
directory, so every process of it shares that file unless something stops it writing there."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES = os.environ.get("MCP_NOTES_FILE") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes.txt")
server = MCPServer("agentloop-notes")


@server.tool()
def note(text: str) -> str:
    """Add a note."""
    try:
        with open(NOTES, "a") as file:
            file.write(text + "\n")
    except OSError as error:  # said to the model, as the SDK hides an unexpected exception's text
        raise ToolError(f"cannot keep the note: {error}") from None
    return "noted"


@server.tool()
def notes() -> str:
    """Every note so far, one a line ("none" when there are none)."""
    try:
        with open(NOTES) as file:
            return file.read().strip() or "none"
    except FileNotFoundError:
        return "none"


@server.tool()
def echo(text: str) -> str:
    """``text`` back (a call that needs no file)."""
    return text


if __name__ == "__main__":
    server.run()
