"""Each trajectory's MCP server process has a world of its own (agentloop_grpc/tools/mcp_world.py): its own folder
as working directory, HOME, TMPDIR and XDG folders, named by placeholders, and, sandboxed (the default where bwrap
works), nothing else writable. Tried with a stateful server nobody here wrote (``@modelcontextprotocol/server-memory``
from npm, a knowledge graph in a file), with ours (``mcp_test_server.py``: where it runs, files where it is told;
``mcp_notes_server.py``: notes in a file at a fixed path), and with a real ``agentloop tools serve`` stopped while
trajectories hold their servers: no process and no folder outlives it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

pytest.importorskip("mcp", reason="the mcp extra is not installed (make setup installs it)")

from agentloop_grpc.common.jail import probe_cached
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.mcp_world import JAILED_DIR
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.server import ToolServer, create_tool_server

from .conftest import serving

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MEMORY = HERE / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-memory"
#: Where server-memory keeps its graph by default: memory.jsonl beside its script.
MEMORY_PACKAGE = HERE / "mcp_servers" / "node_modules" / "@modelcontextprotocol" / "server-memory"
TEST_SERVER = [sys.executable, str(HERE / "mcp_test_server.py")]
NOTES_SERVER = [sys.executable, str(HERE / "mcp_notes_server.py")]
SECRET = {"name": "secret_of_A", "entityType": "answer", "observations": ["the answer is 42"]}

needs_memory = pytest.mark.skipif(not MEMORY.exists(), reason="npm MCP servers not installed (make setup does)")
needs_bwrap = pytest.mark.skipif(probe_cached() is not None, reason=f"no sandbox here: {probe_cached()}")
SANDBOX = [pytest.param(True, marks=needs_bwrap, id="sandboxed"), pytest.param(False, id="unsandboxed")]


@asynccontextmanager
async def mcp_tools(*servers: dict) -> AsyncIterator[tuple[ToolServer, GrpcToolClient]]:
    config = ToolServerConfig.model_validate({"tools": [{"mcp": s} for s in servers]})
    async with serving(config) as served:
        yield served


async def call(client: GrpcToolClient, instance: str, **arguments):
    return await client.execute(instance, json.dumps(arguments))


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tool server's temporary folder, where unsandboxed servers' folders go: empty at the start."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def servers(needle: str) -> list[psutil.Process]:
    """Live MCP server processes below this one whose command line holds ``needle`` (bwrap's own left out)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            line = process.cmdline()
            if process.status() != psutil.STATUS_ZOMBIE and needle in " ".join(line) \
                    and not line[0].endswith("bwrap"):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


async def until(condition, within_s: float = 15.0) -> bool:
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.05)
    return True


def package_files() -> set[Path]:
    return set(MEMORY_PACKAGE.rglob("*"))


@needs_memory
@pytest.mark.parametrize("sandbox", SANDBOX)
@pytest.mark.fault
async def test_server_memory_keeps_each_trajectory_s_graph_to_itself(sandbox: bool, temp_root: Path) -> None:
    """The issue's case: A's entity is invisible to B while A is open and to C after A is released; A keeps its
    own; nothing is left behind, beside the server's script or in the temporary folder."""
    before = package_files()
    entry = {"name": "memory", "command": [str(MEMORY)], "sandbox": sandbox,
             "env": {"MEMORY_FILE_PATH": "{instance_dir}/memory.jsonl"}}
    async with mcp_tools(entry) as (server, client):
        a_write, a_read = [await client.create_instance(name, "A") for name in ("create_entities", "read_graph")]
        created = await call(client, a_write, entities=[SECRET])
        assert not created.is_error, created.content
        assert "secret_of_A" in (await call(client, a_read)).content  # A's own state is kept between its calls

        b_read = await client.create_instance("read_graph", "B")
        graph = await call(client, b_read)
        assert not graph.is_error and "secret_of_A" not in graph.content  # B, while A is open
        assert len(servers(str(MEMORY))) == 2  # one process per trajectory
        if not sandbox:
            assert len(list(temp_root.iterdir())) == 2  # a folder each

        for instance in (a_write, a_read):
            await client.release(instance)
        await until(lambda: len(servers(str(MEMORY))) == 1)  # A's process stopped with its last release
        if not sandbox:
            assert len(list(temp_root.iterdir())) == 1  # and its folder removed
        c_read = await client.create_instance("read_graph", "C")
        graph = await call(client, c_read)
        assert not graph.is_error and "secret_of_A" not in graph.content  # C, after A was released
        await client.release(b_read)
        assert server.instances.live_instances == 1  # C is still open when the server stops
    assert not servers(str(MEMORY))
    assert list(temp_root.iterdir()) == []
    assert package_files() == before  # no memory.jsonl beside its script: the next run starts empty


@needs_memory
@needs_bwrap
@pytest.mark.fault
async def test_server_memory_with_the_defaults_cannot_write_beside_its_script() -> None:
    """Configured with nothing but its command, server-memory writes its graph beside its own script, a file every
    process would share: sandboxed, that write is refused, the model reads it as the tool's error, the trajectory
    goes on, and no other trajectory sees anything of it."""
    before = package_files()
    async with mcp_tools({"name": "memory", "command": [str(MEMORY)]}) as (_, client):
        a_write, a_read = [await client.create_instance(name, "A") for name in ("create_entities", "read_graph")]
        refused = await call(client, a_write, entities=[SECRET])
        assert refused.error_kind is ToolErrorKind.EXCEPTION and "read-only file system" in refused.content
        assert json.loads((await call(client, a_read)).content)["entities"] == []  # the trajectory goes on
        b_read = await client.create_instance("read_graph", "B")
        assert "secret_of_A" not in (await call(client, b_read)).content
    assert package_files() == before


@needs_bwrap
@pytest.mark.parametrize("where", ["beside its script", "a fixed path outside"])
@pytest.mark.fault
async def test_a_server_writing_to_a_fixed_path_is_refused_and_its_trajectory_goes_on(where: str) -> None:
    """A server that keeps its notes at a fixed absolute path (here from a variable, as many take theirs) would
    share them between every trajectory: sandboxed, the write is refused, the model reads the tool's error, the
    same session answers the next call, and the file never appears."""
    name = f"agentloop-notes-{uuid.uuid4().hex}.txt"
    path = HERE / name if where == "beside its script" else Path("/var/tmp") / name
    try:
        async with mcp_tools({"name": "notes", "command": NOTES_SERVER, "env": {"MCP_NOTES_FILE": str(path)}}) \
                as (_, client):
            a_note, a_echo = [await client.create_instance(tool, "A") for tool in ("note", "echo")]
            refused = await call(client, a_note, text="the answer is 42")
            assert refused.error_kind is ToolErrorKind.EXCEPTION
            assert "Read-only file system" in refused.content or "No such file or directory" in refused.content
            assert (await call(client, a_echo, text="still here")).content == "still here"
            b_notes = await client.create_instance("notes", "B")
            assert (await call(client, b_notes)).content == "none"
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


async def test_unsandboxed_a_fixed_path_is_shared_as_the_docs_warn(tmp_path: Path, caplog) -> None:
    """What the sandbox is for: without it, a file at a fixed path is written, and read by the next trajectory;
    the server says so loudly when it starts."""
    path = tmp_path / "notes.txt"
    entry = {"name": "notes", "command": NOTES_SERVER, "env": {"MCP_NOTES_FILE": str(path)}, "sandbox": False}
    async with mcp_tools(entry) as (_, client):
        assert (await call(client, await client.create_instance("note", "A"), text="from A")).content == "noted"
        assert (await call(client, await client.create_instance("notes", "B"))).content == "from A"
    assert "MCP SERVER 'notes' IS NOT SANDBOXED (sandbox: false)" in caplog.text


@pytest.mark.parametrize("sandbox", SANDBOX)
@pytest.mark.fault
async def test_each_process_has_its_own_folder_home_tmpdir_and_xdg(sandbox: bool, temp_root: Path) -> None:
    """The folder's layout and the placeholders in command, env and cwd; what A writes where it writes by default
    (its working directory, home, XDG and temporary folders; sandboxed, /tmp too), B finds nothing of in its own;
    sandboxed, nothing of A's is reachable at all, while unsandboxed A's folder is, by its absolute path (the same
    user: what the docs warn of); A's folder goes with A's last release."""
    entry = {"name": "test", "command": [*TEST_SERVER, "{home}/argument"], "cwd": "{instance_dir}/work",
             "env": {"MCP_TEST_NOTE": "{instance_dir}/note"}, "sandbox": sandbox}

    async def defaults(trajectory: str) -> tuple[str, Path, list[str]]:
        """The instance that asked, the trajectory's folder, checked, and the files it writes to by default."""
        asked = await client.create_instance("where", trajectory)
        place = json.loads((await call(client, asked)).content)
        folder = Path(place["env"]["MCP_TEST_NOTE"]).parent
        if sandbox:
            assert folder == Path(JAILED_DIR)
        else:
            assert folder.parent == temp_root and folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
        home = f"{folder}/home"
        assert place["cwd"] == f"{folder}/work" and place["argv"][-1] == f"{home}/argument"
        assert place["env"] == {"HOME": home, "TMPDIR": f"{folder}/tmp", "XDG_CONFIG_HOME": f"{home}/.config",
                                "XDG_CACHE_HOME": f"{home}/.cache", "XDG_DATA_HOME": f"{home}/.local/share",
                                "XDG_STATE_HOME": f"{home}/.local/state", "XDG_RUNTIME_DIR": f"{folder}/run",
                                "MCP_TEST_NOTE": f"{folder}/note"}
        return asked, folder, [f"{folder}/work/kept.txt", f"{home}/kept.txt", f"{home}/.config/kept.txt",
                        f"{folder}/tmp/kept.txt", f"{folder}/run/kept.txt"] + (["/tmp/kept.txt"] if sandbox else [])

    async with mcp_tools(entry) as (_, client):
        a_where, a_folder, a_files = await defaults("A")
        a_write, a_read = [await client.create_instance(tool, "A") for tool in ("write_file", "read_file")]
        assert (await call(client, a_write, path="kept.txt", text="A's")).content == "written"  # relative: cwd
        for path in a_files[1:]:
            assert (await call(client, a_write, path=path, text="A's")).content == "written", path
        assert [(await call(client, a_read, path=path)).content for path in a_files] == ["A's"] * len(a_files)

        _, b_folder, b_files = await defaults("B")
        b_read = await client.create_instance("read_file", "B")
        assert [(await call(client, b_read, path=path)).content for path in b_files] == ["absent"] * len(b_files)
        reached = [(await call(client, b_read, path=path)).content for path in a_files]
        assert reached == (["absent"] * len(a_files) if sandbox else ["A's"] * len(a_files))
        assert (a_folder == b_folder) is sandbox

        for instance in (a_where, a_write, a_read):
            await client.release(instance)
        assert not a_folder.exists() or sandbox  # unsandboxed, A's host folder went with its last release
        assert (await call(client, b_read, path=b_files[0])).content == "absent"  # B is unaffected
    assert list(temp_root.iterdir()) == []


@needs_bwrap
async def test_the_sandbox_shows_read_only_paths_on_request(tmp_path: Path) -> None:
    """A host path the command does not name is not there, unless ``read_only`` lists it; it stays read-only."""
    data = tmp_path / "data.txt"
    data.write_text("shared data")
    plain = {"name": "plain", "command": TEST_SERVER}
    shown = {"name": "shown", "command": TEST_SERVER, "read_only": [str(tmp_path)], "prefix": "shown_"}
    async with mcp_tools(plain, shown) as (_, client):
        assert (await call(client, await client.create_instance("read_file", "A"), path=str(data))).content == \
            "absent"
        assert (await call(client, await client.create_instance("shown_read_file", "A"), path=str(data))).content \
            == "shared data"
        write = await client.create_instance("shown_write_file", "A")
        refused = await call(client, write, path=str(data), text="changed")
        assert refused.error_kind is ToolErrorKind.EXCEPTION and "Read-only file system" in refused.content
    assert data.read_text() == "shared data"


def test_placeholders_are_checked_at_load_naming_the_field() -> None:
    def load(entry: dict) -> str:
        with pytest.raises(ValidationError) as raised:
            ToolServerConfig.model_validate({"tools": [{"mcp": entry}]})
        return str(raised.value)

    assert "env.MEMORY_FILE_PATH names {instance}, which is not a placeholder" in load(
        {"name": "m", "command": ["x"], "env": {"MEMORY_FILE_PATH": "{instance}/m.jsonl"}})
    assert "command[2] names {workdir}" in load({"name": "m", "command": ["x", "-a", "{workdir}"]})
    assert "cwd names {home}, but a `shared: true` server has no per-trajectory folder" in load(
        {"name": "m", "command": ["x"], "cwd": "{home}", "shared": True})
    assert "`sandbox` is for a server per trajectory" in load(
        {"name": "m", "command": ["x"], "shared": True, "sandbox": False})
    assert "`network`, `read_only` are for a command (a URL server is not a process of ours)" in load(
        {"name": "m", "url": "http://127.0.0.1:1/mcp", "network": True, "read_only": ["/opt"]})
    assert "read_only paths are absolute" in load({"name": "m", "command": ["x"], "read_only": ["opt"]})
    # JSON in an argument is text; {{name}} is the text {name}
    config = ToolServerConfig.model_validate({"tools": [{"mcp": {"name": "m", "command": [
        "x", '{"a": {"b": 1}}', "{{instance_dir}}"]}}]})
    assert config.tools[0].mcp is not None


@needs_memory
@pytest.mark.fault
async def test_a_stopped_tool_server_leaves_no_process_and_no_folder(tmp_path: Path) -> None:
    """``agentloop tools serve`` stopped (SIGTERM, as a rollout stops it) while trajectories hold their servers,
    sandboxed and not: every process is gone and no folder is left in its temporary folder."""
    marker = f"agentloop-test-{uuid.uuid4().hex}"
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"tools": [
        {"mcp": {"name": "memory", "command": [str(MEMORY), marker],
                 "env": {"MEMORY_FILE_PATH": "{instance_dir}/memory.jsonl"}}},
        {"mcp": {"name": "test", "command": [*TEST_SERVER, marker], "sandbox": False, "prefix": "t_"}},
    ]}))
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config",
                                str(config), "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(temp)})
    try:
        line = process.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        client = GrpcToolClient(line.split("listening on ", 1)[1].split()[0], timeout_s=30)
        try:
            for trajectory in ("A", "B"):
                write = await client.create_instance("create_entities", trajectory)
                assert not (await call(client, write, entities=[SECRET])).is_error
                await call(client, await client.create_instance("t_write_file", trajectory), path="x", text="x")
        finally:
            await client.close()

        assert len(held(marker)) >= 4 and len(list(temp.iterdir())) == 2  # 2 trajectories x 2 servers; 2 folders
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        await until(lambda: not held(marker))
        assert list(temp.iterdir()) == []
    finally:
        process.kill()
        process.wait()


def held(marker: str) -> list[psutil.Process]:
    """Live processes anywhere on the host whose command line holds ``marker``."""
    found = []
    for candidate in psutil.process_iter():
        try:
            if marker in " ".join(candidate.cmdline()) and candidate.status() != psutil.STATUS_ZOMBIE:
                found.append(candidate)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def serve(config: Path, cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``agentloop tools serve --config config`` run from ``cwd``: the process and its address."""
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "tools", "serve", "--config",
                                str(config), "--port", "0"], cwd=cwd, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    line = process.stdout.readline()
    assert "listening on 127.0.0.1:" in line, line
    return process, line.split("listening on ", 1)[1].split()[0]


@needs_memory
async def test_the_documented_server_memory_config_serves_as_written(tmp_path: Path) -> None:
    """docs/tools.md's server-memory entry, served from the folder where npm installed it (its relative command
    means what it says there, though the process runs in its own folder): A's graph is A's."""
    page = (ROOT / "docs" / "tools.md").read_text()
    snippet = page.split("server-memory (npm)", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "tools.yaml"
    config.write_text(snippet)
    process, address = serve(config, HERE / "mcp_servers")
    client = GrpcToolClient(address, timeout_s=30)
    try:
        write = await client.create_instance("create_entities", "A")
        assert not (await call(client, write, entities=[SECRET])).is_error
        read_a, read_b = [await client.create_instance("read_graph", t) for t in ("A", "B")]
        assert "secret_of_A" in (await call(client, read_a)).content
        assert "secret_of_A" not in (await call(client, read_b)).content
    finally:
        await client.close()
        process.terminate()
        process.wait(timeout=60)


@needs_bwrap
@pytest.mark.fault
async def test_sandboxed_servers_die_with_a_killed_tool_server(tmp_path: Path) -> None:
    """SIGKILL leaves the tool server no time to stop anything: its sandboxed servers die with it (bwrap's
    die-with-parent takes their PID namespace down)."""
    marker = f"agentloop-test-{uuid.uuid4().hex}"
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"tools": [{"mcp": {"name": "test", "command": [*TEST_SERVER, marker]}}]}))
    process, address = serve(config, ROOT)
    client = GrpcToolClient(address, timeout_s=30)
    try:
        for trajectory in ("A", "B"):
            await call(client, await client.create_instance("pid", trajectory))
        assert len([p for p in held(marker) if not p.cmdline()[0].endswith("bwrap")]) == 2
        process.kill()
        process.wait()
        await until(lambda: not held(marker))
    finally:
        await client.close()
        process.kill()
        process.wait()


@needs_bwrap
async def test_a_server_that_needs_more_than_the_sandbox_shows_fails_saying_so(tmp_path: Path) -> None:
    """A server reading a file its command does not name fails at start-up; the error says it ran sandboxed
    and what to do; ``read_only`` shows it the file."""
    settings = tmp_path / "settings.txt"
    settings.write_text("x")
    reader = [sys.executable, "-c", f"import runpy, sys; open({str(settings)!r}).read(); "
              "runpy.run_path(sys.argv[1], run_name='__main__')", str(HERE / "mcp_test_server.py")]
    config = ToolServerConfig.model_validate({"tools": [{"mcp": {"name": "reader", "command": reader,
                                                                 "start_timeout_s": 20}}]})
    with pytest.raises(ValueError, match=r"'reader' could not be started.*it runs sandboxed.*`read_only` adds paths"):
        await create_tool_server(config, "127.0.0.1:0")
    config.tools[0].mcp.read_only.append(str(tmp_path))
    async with serving(config) as (_, client):
        assert "pid" in {spec.name for spec in await client.list_tools()}


@needs_memory
async def test_without_bwrap_a_server_runs_in_its_own_folder_and_says_it_is_not_sandboxed(
        temp_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from agentloop_grpc.tools import mcp_tools as module

    monkeypatch.setattr(module, "probe_cached", lambda: "bubblewrap (bwrap) is not installed")
    entry = {"name": "memory", "command": [str(MEMORY)], "env": {"MEMORY_FILE_PATH": "{instance_dir}/memory.jsonl"}}
    async with mcp_tools(entry) as (_, client):
        write = await client.create_instance("create_entities", "A")
        assert not (await call(client, write, entities=[SECRET])).is_error
        assert [p.name.startswith("agentloop-mcp-memory-") for p in temp_root.iterdir()] == [True]
        read = await client.create_instance("read_graph", "B")
        assert "secret_of_A" not in (await call(client, read)).content
    assert "MCP SERVER 'memory' IS NOT SANDBOXED (bubblewrap (bwrap) is not installed)" in caplog.text
    assert list(temp_root.iterdir()) == []
