"""A real ToolExecute server on loopback hosting the built-ins, and a gRPC client to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest

from agentloop_grpc.serving.metrics import ServerMetrics
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig, load_config
from agentloop_grpc.tools.server import ToolServer, create_tool_server

from .gate_tool import gate

BUILTIN = Path(__file__).resolve().parents[2] / "agentloop_grpc" / "tools" / "builtin.yaml"


def children(needle: str) -> set[int]:
    """Pids of this process's live children whose command line holds ``needle``. A zombie (a child another test
    left unreaped) or a child that exits while listed is passed over: it runs nothing, and reading it raised."""
    found = set()
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and needle in " ".join(child.cmdline()):
                found.add(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
            continue
    return found


@asynccontextmanager
async def tool_server(**limits) -> AsyncIterator[tuple[ToolServer, GrpcToolClient]]:
    config = load_config(BUILTIN)
    data = config.model_dump(by_alias=True)
    data["limits"].update(limits)
    for entry in data["tools"]:
        if entry.get("class") and entry["class"].endswith("PythonTool"):
            entry["kwargs"]["wall_timeout_s"] = 3
    async with serving(ToolServerConfig.model_validate(data)) as served:
        yield served


@asynccontextmanager
async def serving(config: ToolServerConfig) -> AsyncIterator[tuple[ToolServer, GrpcToolClient]]:
    """A ToolExecute server of ``config`` on loopback port 0, and a gRPC client to it."""
    server = await create_tool_server(config, "127.0.0.1:0")
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


@asynccontextmanager
async def gated_server(name: str, running: int, queued: int, timeout_s: float = 30.0
                       ) -> AsyncIterator[tuple[ToolServer, GrpcToolClient, ServerMetrics]]:
    """A server hosting the gate tool (gate ``name``, opened on the way out) and the calculator, at these limits."""
    config = ToolServerConfig.model_validate({
        "tools": [{"function": "tests.tools.gate_tool:wait_at_gate"},
                  {"function": "agentloop_grpc.tools.builtin.calculator:calculator"}],
        "limits": {"max_concurrent_executions": running, "max_queued_executions": queued, "function_timeout_s": 60},
    })
    metrics = ServerMetrics()
    server = await create_tool_server(config, "127.0.0.1:0", metrics=metrics)
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=timeout_s)
    try:
        yield server, client, metrics
    finally:
        gate(name).set()
        await client.close()
        await server.stop(grace_s=1)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for what another task does (bounded, so a broken server fails the test instead of hanging it)."""
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.01)


@asynccontextmanager
async def slots_held(server: ToolServer, name: str, count: int = 1) -> AsyncIterator[None]:
    """``count`` calls waiting at gate ``name``, made by a client whose deadline outlasts the test's calls, running
    until the way out, which opens the gate and waits for them."""
    patient = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=60)
    held = []
    try:
        for i in range(count):
            instance = await patient.create_instance("wait_at_gate", f"holder-{i}")
            held.append(asyncio.create_task(patient.execute(instance, json.dumps({"name": name}))))
        await until(lambda: server.instances.running_executions == count)
        yield
    finally:
        gate(name).set()
        results = await asyncio.gather(*held)
        await patient.close()
    assert [r.content for r in results] == [f"passed {name}"] * count
