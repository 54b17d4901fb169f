"""tools.yaml: which tools a ToolExecute server hosts, and its limits.

    tools:
      - function: agentloop_grpc.tools.builtin.calculator:calculator   # a typed function; schema inferred
      - class: agentloop_grpc.tools.builtin.python_tool:PythonTool     # a Tool class
        kwargs: {wall_timeout_s: 10}
      - mcp: {name: time, command: [mcp-server-time]}                  # an MCP server's tools (mcp_config.py)
    limits: {max_instances: 1024, max_concurrent_executions: 64, max_queued_executions: 1024, instance_ttl_s: 600}

verl's tool YAML is accepted as it is: an entry with ``class_name`` (``pkg.module.Class``, a verl ``BaseTool``),
``config`` and ``tool_schema`` becomes a class tool of verl's adapter (``VERL_ADAPTER``, imported only when such a
file is served), so a verl tool runs in this server's process like ours. Both kinds may share one file.

Tools are built once at start-up by ``open_tools`` into a dict by name (an explicit object: no global
registry); a name collision, an import failure or an MCP server that cannot start is a start-up error.
"""

from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentloop_grpc.common.yaml_config import load_yaml_config

from .errors import ToolBackendError
from .mcp_config import McpServerEntry
from .tool import FunctionTool, Tool

#: The adapter that hosts a verl tool (the verl integration's; named, not imported: this package needs no verl).
VERL_ADAPTER = "agentloop_grpc.integrations.verl.tools:VerlTool"
_VERL_KEYS = ("class_name", "config", "tool_schema")


def _from_verl(entry: Any) -> Any:
    """A verl tool entry as one of ours (other entries unchanged); ValueError names a key verl does not have."""
    if not isinstance(entry, dict) or "class_name" not in entry:
        return entry
    unknown = sorted(set(entry) - set(_VERL_KEYS))
    if unknown:
        raise ValueError(f"verl tool entry {entry['class_name']!r}: unknown keys {unknown} (verl's are "
                         f"{list(_VERL_KEYS)})")
    return {"class": VERL_ADAPTER, "kwargs": {key: entry[key] for key in _VERL_KEYS if entry.get(key) is not None}}


class ToolEntry(BaseModel):
    """One hosted tool (``function`` or ``class``), or the tools of one MCP server (``mcp``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    function: str | None = Field(None, description="module:function of a typed Python function.")
    class_: str | None = Field(None, alias="class", description="module:Class implementing the Tool protocol.")
    name: str | None = Field(None, description="Override the tool's name.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Constructor arguments of a class tool.")
    mcp: McpServerEntry | None = Field(None, description="An MCP server whose tools are hosted (mcp_config.py).")

    @model_validator(mode="after")
    def _one_kind(self) -> ToolEntry:
        if sum(kind is not None for kind in (self.function, self.class_, self.mcp)) != 1:
            raise ValueError("a tool entry names exactly one of `function`, `class` or `mcp`")
        if self.mcp is not None and (self.name or self.kwargs):
            raise ValueError("an `mcp` entry takes its options inside `mcp:` (`prefix` renames its tools)")
        if self.function is not None and self.kwargs:
            raise ValueError("`kwargs` is for class tools")
        return self


class ToolLimits(BaseModel):
    """Bounds that keep a tool server alive whatever its clients do."""

    model_config = ConfigDict(extra="forbid")

    max_instances: int = Field(1024, ge=1, description="Live instances; CreateInstance beyond is RESOURCE_EXHAUSTED.")
    max_concurrent_executions: int = Field(
        64, ge=1, description="Execute calls running at once; further calls wait their turn in a queue."
    )
    max_queued_executions: int = Field(
        1024, ge=0, description="Execute calls that may wait for a running slot (a batch's turns ending together "
        "wait, not fail); beyond is RESOURCE_EXHAUSTED, which the gRPC client retries within its deadline."
    )
    instance_ttl_s: float = Field(
        600.0, gt=0, description="An instance idle this long is released (a client that died leaks nothing)."
    )
    function_timeout_s: float = Field(
        10.0, gt=0, description="A function tool's call running longer is stopped; the model reads a TIMEOUT error."
    )
    function_workers: int = Field(
        4, ge=1, description="Worker processes per sync function tool: calls running at once; more wait their turn."
    )


class ToolServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[ToolEntry] = Field(min_length=1)
    limits: ToolLimits = Field(default_factory=ToolLimits)

    @field_validator("tools", mode="before")
    @classmethod
    def _verl_entries(cls, tools: Any) -> Any:
        return [_from_verl(entry) for entry in tools] if isinstance(tools, list) else tools


def _import(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    if not attribute:
        raise ValueError(f"{reference!r} is not of the form module:attribute")
    return getattr(importlib.import_module(module), attribute)


def build_tools(config: ToolServerConfig) -> dict[str, Tool]:
    """Instantiate every function and class tool; names must be unique. MCP servers need ``open_tools``."""
    tools: dict[str, Tool] = {}
    for entry in config.tools:
        if entry.mcp is not None:
            raise ValueError(f"MCP server {entry.mcp.name!r}: its tools are listed by open_tools, not build_tools")
        if entry.function is not None:
            tool: Tool = FunctionTool(_import(entry.function), name=entry.name,
                                      timeout_s=config.limits.function_timeout_s,
                                      workers=config.limits.function_workers)
        else:
            tool = _import(entry.class_)(**entry.kwargs)
            if entry.name:
                raise ValueError(f"{entry.class_}: `name` can only rename function tools")
        if tool.spec.name in tools:
            raise ValueError(f"two tools are named {tool.spec.name!r}")
        tools[tool.spec.name] = tool
    return tools


async def open_tools(config: ToolServerConfig) -> dict[str, Tool]:
    """Every tool of the config, MCP servers' included (each started once to list its tools); names must be
    unique. ValueError for what is wrong, an MCP server that cannot start included (a start-up error)."""
    plain = config.model_copy(update={"tools": [e for e in config.tools if e.mcp is None]})
    tools = build_tools(plain) if plain.tools else {}
    servers = [entry.mcp for entry in config.tools if entry.mcp is not None]
    if servers:
        from .mcp_tools import McpServer  # the mcp extra, imported only when a config names an MCP server

        for server in servers:
            try:
                listed = await McpServer(server).tools()
            except ToolBackendError as error:
                raise ValueError(str(error)) from error
            for tool in listed:
                if tool.spec.name in tools:
                    raise ValueError(f"two tools are named {tool.spec.name!r} (MCP server {server.name!r}: "
                                     "set `prefix`)")
                tools[tool.spec.name] = tool
    return tools


#: The name that stands for the built-in tools' config (as a rollout YAML's ``tools.launch: builtin`` does).
BUILTIN = "builtin"


def load_config(path: str | Path) -> ToolServerConfig:
    """Read and validate a tools.yaml, or the built-in one for ``builtin`` (ValidationError / OSError /
    yaml.YAMLError / ValueError on bad input)."""
    if str(path) == BUILTIN:
        path = Path(str(resources.files("agentloop_grpc.tools") / "builtin.yaml"))
    return load_yaml_config(path, ToolServerConfig, "a tool server config")
