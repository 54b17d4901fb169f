"""A coding trajectory's workspace, by trying each escape: files outside it, another workspace, the network beside
the gateway, a fork bomb, runaway output, memory, disk and time. Real bubblewrap and real cgroups (make setup
installs bwrap; CI runs as root, as here)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import textwrap
from pathlib import Path

import pytest

from agentloop_grpc.common.jail import probe_cached
from agentloop_grpc.harness import cgroup
from agentloop_grpc.harness.workspace import GATEWAY_PORT, Workspace, WorkspaceError, WorkspaceLimits

pytestmark = pytest.mark.skipif(probe_cached() is not None, reason=f"no sandbox here: {probe_cached()}")

SMALL = WorkspaceLimits(wall_timeout_s=20, memory_bytes=256 * 2**20, max_processes=64, disk_bytes=16 * 2**20,
                        output_bytes=64 * 2**10)


def python(code: str) -> list[str]:
    return ["python3", "-c", textwrap.dedent(code)]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "code.py").write_text("x = 1\n")
    (folder / "Dockerfile").write_text("FROM scratch\n")
    return folder


async def test_the_workspace_is_a_fresh_copy_and_everything_else_is_read_only(tmp_path, repo):
    async with await Workspace.create(tmp_path / "ws", repo, SMALL, leave_out=("Dockerfile",)) as ws, \
            await Workspace.create(tmp_path / "ws", repo, SMALL) as other:
        (other.app / "secret.txt").write_text("the other trajectory's answer")
        result = await ws.run(python(f"""
            import os, pathlib
            pathlib.Path('pkg/code.py').write_text('x = 2\\n')
            print(sorted(os.listdir('.')))
            for path in ('/usr/evil', '/etc/evil', '{repo}/pkg/code.py', '/tmp/../{tmp_path}/evil',
                         '{other.app}/secret.txt', '/home/agent/../../{tmp_path}/evil'):
                try:
                    open(path, 'w').write('x')
                    print('WROTE', path)
                except OSError as error:
                    print('refused', type(error).__name__)
            print('other visible:', os.path.exists('{other.app}'), os.path.exists('{tmp_path}'))
        """))
        assert result.ok, result.output
        assert "['pkg']" in result.output  # the copy, less the container's files
        assert "WROTE" not in result.output and result.output.count("refused") == 6
        assert "other visible: False False" in result.output
        assert (ws.app / "pkg" / "code.py").read_text() == "x = 2\n"  # the host sees the agent's edit
        assert (repo / "pkg" / "code.py").read_text() == "x = 1\n"  # the task's repository is untouched
        folder = ws.folder
    assert not folder.exists()


async def test_no_capability_remounts_a_read_only_bind_writable(tmp_path):
    async with await Workspace.create(tmp_path / "ws", None, SMALL) as ws:
        result = await ws.run(["sh", "-c", "mount -o remount,rw,bind /usr && touch /usr/agentloop-escape && echo "
                                           "ESCAPED; grep CapEff /proc/self/status"])
    assert "ESCAPED" not in result.output and not Path("/usr/agentloop-escape").exists()
    assert "CapEff:\t0000000000000000" in result.output


async def test_a_package_bound_from_the_hosts_tmp_is_not_hidden_by_the_private_tmp(tmp_path):
    """A CLI's package may lie under the host's /tmp (a job's scratch folder): its bind goes on top of the sandbox's
    own /tmp, where before it lay under it, unseen (mounts ordered by depth, as in every jail of common/jail.py)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as package:
        (Path(package) / "VERSION").write_text("cli 1.0\n")
        async with await Workspace.create(tmp_path / "ws", None, SMALL) as ws:
            result = await ws.run(["cat", f"{package}/VERSION"], binds=[Path(package)])
    assert result.ok and result.output == "cli 1.0\n", result


async def test_no_network_but_the_gateway(tmp_path):
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\ngateway")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, await Workspace.create(tmp_path / "ws", None, SMALL) as ws:
        result = await ws.run(python(f"""
            import socket, urllib.request
            print(urllib.request.urlopen('http://127.0.0.1:{GATEWAY_PORT}/sessions/s/v1/models').read().decode())
            for host, port in (('127.0.0.1', {port}), ('10.0.0.1', 80), ('1.1.1.1', 443)):
                try:
                    socket.create_connection((host, port), timeout=2)
                    print('REACHED', host)
                except OSError as error:
                    print('unreachable', host)
            try:
                socket.getaddrinfo('pypi.org', 443)
                print('RESOLVED')
            except OSError:
                print('no dns')
        """), gateway=("127.0.0.1", port))
    assert result.ok, result.output
    assert result.output.splitlines()[0] == "gateway"  # the bridge reaches the gateway
    assert "REACHED" not in result.output and result.output.count("unreachable") == 3  # the host's port too
    assert "no dns" in result.output


async def test_a_fork_bomb_is_bounded_and_ends_with_its_workspace(tmp_path):
    limits = WorkspaceLimits(wall_timeout_s=2, max_processes=32, memory_bytes=512 * 2**20)
    async with await Workspace.create(tmp_path / "ws", None, limits) as ws:
        result = await ws.run(python("""
            import os, time
            n = 0
            try:
                while True:
                    if os.fork() == 0:
                        time.sleep(60)
                        os._exit(0)
                    n += 1
            except OSError as error:
                print('bounded at', n, flush=True)
            time.sleep(60)
        """))
        assert result.cause == "workspace_timeout" and result.seconds < 10
        bounded = int(result.output.split("bounded at")[1].split()[0])
        assert 0 < bounded < 32
    assert not any(p.name.startswith(ws.folder.name) for base in (cgroup.ROOT / "memory" / cgroup.PARENT,
                                                                     cgroup.ROOT / "pids" / cgroup.PARENT)
                   if base.exists() for p in base.iterdir())


async def test_runaway_output_is_cut_at_its_bound(tmp_path):
    limits = WorkspaceLimits(wall_timeout_s=20, output_bytes=4096)
    async with await Workspace.create(tmp_path / "ws", None, limits) as ws:
        result = await ws.run(["sh", "-c", "yes | head -c 20000000"])
    assert result.ok and result.truncated and len(result.output.encode()) == 4096


@pytest.mark.parametrize(("code", "cause"), [
    ("import time; time.sleep(60)", "workspace_timeout"),
    ("b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ALLOCATED')", "workspace_memory"),
    ("import os\nfor i in range(64): open(f'f{i}', 'wb').write(os.urandom(2**20))\nimport time; time.sleep(60)",
     "workspace_disk"),
])
async def test_time_memory_and_disk_stop_the_workspace_by_cause(tmp_path, code, cause):
    limits = WorkspaceLimits(wall_timeout_s=2, memory_bytes=128 * 2**20, disk_bytes=8 * 2**20)
    async with await Workspace.create(tmp_path / "ws", None, limits) as ws:
        result = await ws.run(["python3", "-c", code])
    assert (result.cause, result.exit_code) == (cause, None), result
    assert "ALLOCATED" not in result.output


async def test_a_workspace_that_cannot_be_made_is_an_infrastructure_failure_by_cause(tmp_path):
    with pytest.raises(WorkspaceError) as caught:
        await Workspace.create(tmp_path / "ws", tmp_path / "no-such-repo")
    assert caught.value.cause == "workspace_create"
    assert os.listdir(tmp_path / "ws") == []  # nothing left of it
