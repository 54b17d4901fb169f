"""MCP servers behind a real ToolExecute server on loopback: mcp-server-time (PyPI), the npm reference server
``@modelcontextprotocol/server-everything`` and ``mcp_test_server.py`` (written with the ``mcp`` SDK), started as
commands (stdio) or reached by URL (streamable HTTP). Their tools are listed with their own schemas, each
trajectory holds its own session, results map to ours, and a server that crashes, hangs or never starts fails
only the trajectories it served, as an infrastructure failure with its cause. The tests that kill or watch a
server's process by the pid it reports run it unsandboxed (``sandbox: false``): a sandbox has a PID namespace of its
own, whose pids are not the host's (test_mcp_isolation.py tests the sandbox)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (make setup installs it)")

from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError, ToolRequestError
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.server import ToolServer, create_tool_server

from .conftest import serving

HERE = Path(__file__).resolve().parent
TEST_SERVER = [sys.executable, str(HERE / "mcp_test_server.py")]
TIME_SERVER = [str(Path(sys.executable).parent / "mcp-server-time"), "--local-timezone", "UTC"]
EVERYTHING = HERE / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-everything"


@asynccontextmanager
async def mcp_tools(*servers: dict, **limits) -> AsyncIterator[tuple[ToolServer, GrpcToolClient]]:
    config = ToolServerConfig.model_validate({"tools": [{"mcp": s} for s in servers], "limits": limits})
    async with serving(config) as served:
        yield served


async def call(client: GrpcToolClient, instance: str, **arguments):
    return await client.execute(instance, json.dumps(arguments))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not alive(pid)


@pytest.mark.skipif(not EVERYTHING.exists(), reason="npm MCP servers not installed (make setup installs them)")
async def test_servers_from_pypi_and_npm_behind_tool_execute():
    everything = {"name": "everything", "command": [str(EVERYTHING)], "prefix": "ev_",
                  "tools": ["get-sum", "get-tiny-image", "get-structured-content"]}
    async with mcp_tools({"name": "time", "command": TIME_SERVER}, everything) as (server, client):
        specs = {spec.name: spec for spec in await client.list_tools()}
        assert set(specs) == {"get_current_time", "convert_time", "ev_get-sum", "ev_get-tiny-image",
                              "ev_get-structured-content"}
        assert "timezone" in specs["get_current_time"].parameters["properties"]  # the server's own schema
        assert specs["ev_get-sum"].parameters["required"] == ["a", "b"]

        now = await client.create_instance("get_current_time", "t1")
        result = await call(client, now, timezone="UTC")
        assert not result.is_error and json.loads(result.content)["timezone"] == "UTC"
        bad = await call(client, now, timezone="Nowhere/Atlantis")  # the server's isError: the model reads it
        assert bad.error_kind is ToolErrorKind.EXCEPTION and "Nowhere/Atlantis" in bad.content
        schema_miss = await call(client, now, zone="UTC")  # checked against the server's schema before it runs
        assert schema_miss.error_kind is ToolErrorKind.INVALID_ARGUMENTS and "timezone" in schema_miss.content

        total = await client.create_instance("ev_get-sum", "t1")
        assert "5" in (await call(client, total, a=2, b=3)).content
        picture = await client.create_instance("ev_get-tiny-image", "t1")
        image = (await call(client, picture)).images
        assert len(image) == 1 and image[0].mime_type == "image/png" and image[0].data[:4] == b"\x89PNG"
        weather = await client.create_instance("ev_get-structured-content", "t1")
        assert "temperature" in json.loads((await call(client, weather, location="Chicago")).content)

        with pytest.raises(ToolRequestError, match="no creation arguments"):
            await client.create_instance("ev_get-sum", "t2", {"x": 1})
        for instance in (now, total, picture, weather):
            await client.release(instance)
        assert server.instances.live_instances == 0


async def test_each_trajectory_holds_its_own_session_unless_shared():
    async with mcp_tools({"name": "own", "command": TEST_SERVER, "sandbox": False},
                         {"name": "one", "command": TEST_SERVER, "shared": True, "prefix": "shared_"}) as (_, client):
        a_count, a_pid = [await client.create_instance(name, "a") for name in ("counter", "pid")]
        b_count, b_pid = [await client.create_instance(name, "b") for name in ("counter", "pid")]
        assert [(await call(client, a_count)).content for _ in range(2)] == ["1", "2"]
        assert (await call(client, b_count)).content == "1"  # nothing of trajectory a's session
        pid_a, pid_b = [int((await call(client, i)).content) for i in (a_pid, b_pid)]
        assert pid_a != pid_b  # one server process per trajectory, shared by its tools

        shared = [await client.create_instance("shared_pid", t) for t in ("a", "b")]
        assert len({(await call(client, i)).content for i in shared}) == 1

        await client.release(a_count)
        assert alive(pid_a)  # trajectory a still holds its pid tool
        await client.release(a_pid)
        assert await gone(pid_a)  # its last instance released: its server stopped
        assert alive(pid_b)
        for instance in (b_count, b_pid, *shared):
            await client.release(instance)
        assert await gone(pid_b)


async def test_a_killed_server_fails_only_its_trajectory_and_is_restarted(tmp_path):
    entry = {"name": "test", "command": TEST_SERVER, "env": {"MCP_TEST_MARK_DIR": str(tmp_path)}, "sandbox": False}
    async with mcp_tools(entry) as (server, client):
        victim, bystander = [await client.create_instance("slow", t) for t in ("victim", "bystander")]
        victim_pid = int((await call(client, await client.create_instance("pid", "victim"))).content)
        calls = [asyncio.create_task(call(client, i, seconds=3)) for i in (victim, bystander)]
        while len(list(tmp_path.iterdir())) < 2:  # both calls in flight
            await asyncio.sleep(0.05)
        os.kill(victim_pid, signal.SIGKILL)
        with pytest.raises(ToolInfrastructureError, match="closed the connection during slow") as failure:
            await calls[0]
        assert failure.value.cause == "mcp_server_crashed"
        assert (await calls[1]).content == "done"
        with pytest.raises(ToolInfrastructureError):  # the victim's session is over, not silently reopened
            await call(client, victim, seconds=0)

        again = await client.create_instance("pid", "victim-retry")  # a new instance gets a new server
        assert int((await call(client, again)).content) != victim_pid
        assert server.instances.live_instances == 4


async def test_a_hung_call_and_a_server_that_never_starts(tmp_path):
    hang = tmp_path / "hang"
    entry = {"name": "test", "command": TEST_SERVER, "env": {"MCP_TEST_HANG_FILE": str(hang)},
             "call_timeout_s": 1, "start_timeout_s": 2, "sandbox": False}
    async with mcp_tools(entry) as (_, client):
        pid = int((await call(client, await client.create_instance("pid", "hung"))).content)
        slow = await client.create_instance("slow", "hung")
        started = time.monotonic()
        with pytest.raises(ToolInfrastructureError, match="did not answer slow within call_timeout_s=1") as failure:
            await call(client, slow, seconds=30)
        assert failure.value.cause == "mcp_call_timeout" and time.monotonic() - started < 10
        assert await gone(pid)  # a server that hung is stopped, not reused

        hang.touch()  # from now on the server hangs before its handshake
        with pytest.raises(ToolInfrastructureError, match="start_timeout_s=2") as failure:
            await client.create_instance("pid", "never")
        assert failure.value.cause == "mcp_server_not_started"


async def test_a_server_that_cannot_start_is_a_start_up_error(tmp_path):
    config = ToolServerConfig.model_validate(
        {"tools": [{"mcp": {"name": "silent", "command": ["sleep", "30"], "start_timeout_s": 1}}]})
    with pytest.raises(ValueError, match="'silent' did not finish its handshake"):
        await create_tool_server(config, "127.0.0.1:0")
    bad = tmp_path / "tools.yaml"
    bad.write_text('tools:\n  - mcp: {name: absent, command: ["/no/such/mcp"]}\n')
    config = ToolServerConfig.model_validate({"tools": [{"mcp": {"name": "absent", "command": ["/no/such/mcp"]}}]})
    with pytest.raises(ValueError, match="'absent' could not be started"):
        await create_tool_server(config, "127.0.0.1:0")
    # the CLI says so in one line, as for any config error
    result = subprocess.run([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config", str(bad),
                             "--port", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "MCP server 'absent' could not be started" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_server_reached_by_url_and_output_bounds():
    process = subprocess.Popen([*TEST_SERVER, "--http"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline().split()[1])
        entry = {"name": "web", "url": f"http://127.0.0.1:{port}/mcp", "max_output_bytes": 100}
        async with mcp_tools(entry) as (server, client):
            sessions = [await client.create_instance("pid", t) for t in ("a", "b")]
            assert {int((await call(client, i)).content) for i in sessions} == {process.pid}
            big = await client.create_instance("big", "a")
            text = (await call(client, big, size=5000)).content
            assert text.startswith("x" * 100) and text.endswith("[output truncated: 5000 bytes, 100 kept]")
            failing = await client.create_instance("fail", "a")
            result = await call(client, failing, message="the disk is full")
            assert result.error_kind is ToolErrorKind.EXCEPTION and "the disk is full" in result.content

            process.kill()
            process.wait()
            with pytest.raises(ToolInfrastructureError) as failure:
                await call(client, sessions[1])
            assert failure.value.cause.startswith("mcp_")
            for instance in (*sessions, big, failing):
                await client.release(instance)
            assert server.instances.live_instances == 0
    finally:
        process.kill()
        process.wait()


async def test_the_documented_config_serves_as_written():
    """examples/mcp-tools.yaml, shown in docs/tools.md, served by the CLI with the virtual environment off PATH:
    the MCP server's program is found beside the server's Python."""
    root = HERE.parents[1]
    example = (root / "examples" / "mcp-tools.yaml").read_text()
    assert example.split("\ntools:", 1)[1] in (root / "docs" / "tools.md").read_text()
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if Path(p).resolve() != Path(sys.executable).parent.resolve())
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config",
                                "examples/mcp-tools.yaml", "--port", "0"], cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PATH": path})
    try:
        line = process.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line + process.stderr.read()
        client = GrpcToolClient(line.split("listening on ", 1)[1].split()[0], timeout_s=30)
        try:
            assert {s.name for s in await client.list_tools()} == {"get_current_time", "convert_time", "calculator"}
            instance = await client.create_instance("convert_time", "docs")
            result = await call(client, instance, source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
            assert json.loads(result.content)["target"]["datetime"].endswith("21:00:00+09:00")
            await client.release(instance)
        finally:
            await client.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
