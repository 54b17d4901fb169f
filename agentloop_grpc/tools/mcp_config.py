"""An ``mcp:`` entry of a tools.yaml: one MCP server whose tools a ToolExecute server hosts.

    tools:
      - mcp:
          name: time                                   # names the server in errors and logs
          command: [mcp-server-time, --local-timezone, UTC]   # stdio: started per trajectory (or once: shared)
      - mcp: {name: docs, url: "http://127.0.0.1:8931/mcp", headers: {Authorization: "Bearer ..."}}

Validated without the MCP SDK (the ``mcp`` extra), which is imported only when such a server is started.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class McpServerEntry(BaseModel):
    """One MCP server, started as a command (stdio) or reached by URL (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Names the server in errors, logs and failure causes.")
    command: list[str] | None = Field(None, min_length=1, description="Program and arguments of a stdio server (a "
                                      "bare program name not on PATH is looked up beside the tool server's Python).")
    url: str | None = Field(None, description="Endpoint of a streamable-HTTP server (http:// or https://).")
    env: dict[str, str] = Field(default_factory=dict,
                                description="Environment variables of a command, over the SDK's safe defaults.")
    cwd: str | None = Field(None, description="Working directory of a command.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent to a URL server.")
    tools: list[str] | None = Field(None, description="Host only these of the server's tools (default: all).")
    prefix: str = Field("", description="Prepended to each tool's name (two servers may offer the same name).")
    shared: bool = Field(
        False, description="One session for every trajectory; by default each trajectory has its own (for a "
        "command, its own server process), so no state is shared between trajectories.")
    start_timeout_s: float = Field(30.0, gt=0, description="Spawn (or connect) and handshake; beyond, the "
                                   "instance's trajectory fails as infrastructure (mcp_server_not_started).")
    call_timeout_s: float = Field(60.0, gt=0, description="One tools/call; beyond, the session is closed and the "
                                  "trajectory fails as infrastructure (mcp_call_timeout).")
    max_output_bytes: int = Field(65536, ge=1, description="Text the model reads (UTF-8 bytes, cut beyond) plus "
                                  "images (left out beyond).")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerEntry:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of `command` or `url`")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must start with http:// or https://, got {self.url!r}")
        if self.command is not None and self.headers:
            raise ValueError(f"MCP server {self.name!r}: `headers` are for a URL server")
        if self.url is not None and (self.env or self.cwd):
            raise ValueError(f"MCP server {self.name!r}: `env` and `cwd` are for a command")
        return self
