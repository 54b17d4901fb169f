"""A real ToolExecute server on loopback hosting the built-ins, and a gRPC client to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig, load_config
from agentloop_grpc.tools.server import ToolServer, create_tool_server

BUILTIN = Path(__file__).resolve().parents[2] / "agentloop_grpc" / "tools" / "builtin.yaml"


@asynccontextmanager
async def tool_server(**limits) -> AsyncIterator[tuple[ToolServer, GrpcToolClient]]:
    config = load_config(BUILTIN)
    data = config.model_dump(by_alias=True)
    data["limits"].update(limits)
    for entry in data["tools"]:
        if entry.get("class") and entry["class"].endswith("PythonTool"):
            entry["kwargs"]["wall_timeout_s"] = 3
    server = await create_tool_server(ToolServerConfig.model_validate(data), "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=30)
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop(grace_s=1)


@pytest.fixture
async def tools() -> AsyncIterator[GrpcToolClient]:
    async with tool_server() as (_, client):
        yield client
