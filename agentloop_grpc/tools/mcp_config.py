"""An ``mcp:`` entry of a tools.yaml: one MCP server whose tools a ToolExecute server hosts.

    tools:
      - mcp:
          name: time                                   # names the server in errors and logs
          command: [mcp-server-time, --local-timezone, UTC]   # stdio: started per trajectory (or once: shared)
      - mcp:
          name: memory                                 # each trajectory's process keeps its graph in its own folder
          command: [mcp-server-memory]
          env: {MEMORY_FILE_PATH: "{instance_dir}/memory.jsonl"}
      - mcp: {name: docs, url: "http://127.0.0.1:8931/mcp", headers: {Authorization: "Bearer ..."}}

A command's process per trajectory runs in a world of its own (``mcp_world.py``): a fresh folder as working
directory, HOME, TMPDIR and XDG folders, named in ``command``, ``env`` and ``cwd`` by the PLACEHOLDERS, and a
bubblewrap jail whose only writable places are that folder and a private /tmp. Validated without the MCP SDK (the
``mcp`` extra), which is imported only when such a server is started.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: What ``{name}`` in a command, an env value or cwd stands for (a per-trajectory server's folders).
PLACEHOLDERS = {
    "instance_dir": "the trajectory's folder: the process's working directory, writable, removed with the session",
    "home": "its HOME, {instance_dir}/home (XDG_CONFIG_HOME, XDG_CACHE_HOME, XDG_DATA_HOME, XDG_STATE_HOME below)",
    "tmpdir": "its TMPDIR, {instance_dir}/tmp",
}
#: ``{name}`` is a placeholder, ``{{name}}`` the literal text ``{name}``; any other brace is text (JSON stays JSON).
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")


def placeholders(text: str) -> list[str]:
    """The placeholder names ``text`` uses (escaped ones left out)."""
    return [match.group(2) for match in _PLACEHOLDER.finditer(text) if match.group(2)]


def expand(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``{name}`` replaced by ``values[name]`` and each ``{{name}}`` by ``{name}``."""
    return _PLACEHOLDER.sub(lambda m: "{" + m.group(1) + "}" if m.group(1) else values[m.group(2)], text)


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
        False, description="One session (one process) for every trajectory, started as it was configured: no "
        "folder of its own, no sandbox, so whatever it keeps is shared by all. By default each trajectory has its "
        "own session (for a command, its own process in its own folder and sandbox).")
    sandbox: bool = Field(
        True, description="Run each trajectory's process in a bubblewrap jail (where bwrap works: the server logs "
        "loudly where it does not): only its folder and a private /tmp writable, the filesystem read-only and "
        "limited to what the command needs, its own PID namespace, no network unless `network`.")
    network: bool = Field(False, description="The sandboxed process keeps the host's network (default: none but "
                          "a loopback of its own; a stdio server needs none).")
    read_only: list[str] = Field(
        default_factory=list, description="More host paths (absolute) the sandboxed process may read, beyond /usr, "
        "system files of /etc and what its command names (its program, interpreter, venv or node_modules, the "
        "folders of the files it names).")
    instance_dir_bytes: int = Field(
        256 * 2**20, ge=2**20, description="What the trajectory's folder may hold when sandboxed (a tmpfs: memory, "
        "gone with the process); unsandboxed it is a host folder with no quota.")
    tmp_bytes: int = Field(64 * 2**20, ge=2**20, description="Size of the sandboxed process's private /tmp (a tmpfs).")
    start_timeout_s: float = Field(30.0, gt=0, description="Spawn (or connect) and handshake; beyond, the "
                                   "instance's trajectory fails as infrastructure (mcp_server_not_started).")
    call_timeout_s: float = Field(60.0, gt=0, description="One tools/call; beyond, the session is closed and the "
                                  "trajectory fails as infrastructure (mcp_call_timeout).")
    max_output_bytes: int = Field(65536, ge=1, description="Text the model reads (UTF-8 bytes, cut beyond) plus "
                                  "images (left out beyond).")

    @property
    def per_trajectory(self) -> bool:
        """Whether each trajectory's session starts a process of its own, in a world of its own."""
        return self.command is not None and not self.shared

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerEntry:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of `command` or `url`")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must start with http:// or https://, got {self.url!r}")
        if self.command is not None and self.headers:
            raise ValueError(f"MCP server {self.name!r}: `headers` are for a URL server")
        world = [f for f in _WORLD_FIELDS if f in self.model_fields_set]
        process = [f for f in ("env", "cwd") if getattr(self, f)] + world
        if self.url is not None and process:
            raise ValueError(f"MCP server {self.name!r}: {_are(process)} for a command (a URL server is not a "
                             "process of ours)")
        if self.shared and world:
            raise ValueError(f"MCP server {self.name!r}: {_are(world)} for a server per trajectory; `shared: true` "
                             "starts one process, as configured, unsandboxed")
        for where, text in self._templated():
            for name in placeholders(text):
                if name not in PLACEHOLDERS:
                    raise ValueError(f"MCP server {self.name!r}: {where} names {{{name}}}, which is not a "
                                     f"placeholder (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}; "
                                     f"write {{{{{name}}}}} for the text {{{name}}})")
                if self.shared:
                    raise ValueError(f"MCP server {self.name!r}: {where} names {{{name}}}, but a `shared: true` "
                                     "server has no per-trajectory folder")
        for path in self.read_only:
            if not path.startswith("/"):
                raise ValueError(f"MCP server {self.name!r}: read_only paths are absolute, got {path!r}")
        return self

    def _templated(self) -> Iterator[tuple[str, str]]:
        """The fields where placeholders are expanded: (where, text)."""
        for i, word in enumerate(self.command or ()):
            yield f"command[{i}]", word
        for key, value in self.env.items():
            yield f"env.{key}", value
        if self.cwd is not None:
            yield "cwd", self.cwd


def _are(fields: list[str]) -> str:
    names = ", ".join(f"`{f}`" for f in fields)
    return f"{names} {'is' if len(fields) == 1 else 'are'}"


#: Options of a per-trajectory server's world.
_WORLD_FIELDS = ("sandbox", "network", "read_only", "instance_dir_bytes", "tmp_bytes")
