"""The python tool's sandbox against the escapes a model-written program tries; the server stays healthy."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.sandbox import SandboxLimits, probe_isolation

from .conftest import BUILTIN, tool_server

pytestmark = pytest.mark.skipif(
    probe_isolation() is not None, reason=f"sandbox isolation unavailable here: {probe_isolation()}"
)


async def _run(client, instance: str, code: str):
    return await client.execute(instance, json.dumps({"code": code}))


async def _healthy(client) -> None:
    calc = await client.create_instance("calculator", "health")
    assert (await client.execute(calc, json.dumps({"expression": "1 + 1"}))).content == "2"


async def test_no_network_even_to_loopback() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        async with tool_server() as (_, client):
            py = await client.create_instance("python", "t")
            connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
            result = await _run(client, py, connect)
            assert result.error_kind is ToolErrorKind.EXCEPTION
            assert "ConnectionRefusedError" in result.content or "OSError" in result.content
            dns = await _run(client, py, "import socket\nsocket.getaddrinfo('pypi.org', 443)")
            assert dns.is_error
            await _healthy(client)
    finally:
        listener.close()


async def test_files_outside_the_private_folder_are_invisible(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        for path in (secret, Path(__file__), Path("/etc/passwd"), Path.home() / ".bashrc"):
            result = await _run(client, py, f"open({str(path)!r}).read()")
            assert result.error_kind is ToolErrorKind.EXCEPTION and "Error" in result.content, path
            assert "top secret" not in result.content
        written = await _run(client, py, "open('notes.txt', 'w').write('kept'); open('notes.txt').read()")
        assert written.content == "'kept'"  # the private folder works
        await _healthy(client)


async def test_server_environment_is_not_visible() -> None:
    os.environ["AGENTLOOP_TEST_SECRET"] = "hunter2"
    try:
        async with tool_server() as (_, client):
            py = await client.create_instance("python", "t")
            env = await _run(client, py, "import os\nsorted(os.environ)")
            assert "AGENTLOOP_TEST_SECRET" not in env.content
            proc = await _run(client, py, "import glob\n[open(p, 'rb').read() for p in glob.glob('/proc/*/environ')]")
            assert "hunter2" not in proc.content
    finally:
        del os.environ["AGENTLOOP_TEST_SECRET"]


async def test_fork_bomb_is_contained() -> None:
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        result = await _run(client, py, "import os\nwhile True:\n    os.fork()")
        assert result.is_error
        await _healthy(client)
        again = await _run(client, py, "1 + 1")  # the session recovers (restarted if it died)
        assert again.content.endswith("2")


async def test_allocating_8_gb_is_contained() -> None:
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        result = await _run(client, py, "x = bytearray(8 * 1024**3)")
        assert result.error_kind is ToolErrorKind.RESOURCE_LIMIT and "MemoryError" in result.content
        assert (await _run(client, py, "len('ok')")).content == "2"
        await _healthy(client)


async def test_infinite_loop_times_out_and_the_session_restarts() -> None:
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        await _run(client, py, "kept = 1")
        started = time.monotonic()
        result = await _run(client, py, "while True:\n    pass")
        assert result.error_kind is ToolErrorKind.TIMEOUT
        assert time.monotonic() - started < 10
        after = await _run(client, py, "'kept' in globals()")
        assert "restarted" in after.content and after.content.endswith("False")
        await _healthy(client)


async def test_printing_100_mb_is_truncated() -> None:
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        result = await _run(client, py, "print('x' * (100 * 1024 * 1024))")
        assert not result.is_error
        assert "[output truncated: 104857601 bytes printed" in result.content
        assert len(result.content) < 20_000
        await _healthy(client)


_EVERY_FD = "import os\nfds = [int(fd) for fd in os.listdir('/proc/self/fd') if int(fd) > 2]\n"


@pytest.mark.fault
async def test_a_reply_forged_by_the_code_is_not_its_output_and_later_calls_stay_in_step() -> None:
    """The code could write to the runner's reply channel: a forged reply became the call's output, and every
    later call then returned the previous call's reply."""
    forged = json.dumps({"stdout": "forged", "stderr": "", "error": None, "truncated": False, "printed": 6}) + "\n"
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        result = await _run(client, py, _EVERY_FD + "for fd in fds:\n    try:\n        os.write(fd, "
                            f"{forged.encode()!r})\n    except OSError:\n        pass\n'real'")
        assert "forged" not in result.content
        assert result.content == "'real'" or (result.is_error and "reply channel" in result.content), result
        assert (await _run(client, py, "1 + 1")).content.endswith("2")
        assert (await _run(client, py, "'in step'")).content == "'in step'"
        await _healthy(client)


@pytest.mark.fault
async def test_a_reply_forged_with_the_calls_own_nonce_stays_within_its_call_and_session() -> None:
    """What the sandbox's docstring says holds: code that reads its call's nonce (the runner's variables are its
    own) can answer that call itself, within the reply's shape; the runner's real reply, left behind, never answers
    the next call: that call ends in a tool error and a restart, and the one after is in step again."""
    forge = ("import json, sys\nnonce = sys.modules['__main__'].request['nonce']\n"
             "body = json.dumps({'output': 'forged', 'error': None, 'truncated': False, 'printed': 6}).encode()\n"
             "frame = b'%s %d\\n' % (nonce.encode(), len(body)) + body\n"
             "for fd in fds:\n    try:\n        os.write(fd, frame)\n    except OSError:\n        pass\n'real'")
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        other = await client.create_instance("python", "other")
        assert (await _run(client, other, "kept = 'other session'")).content == ""
        forged = await _run(client, py, _EVERY_FD + forge)
        assert forged.content == "forged" and not forged.is_error
        after = await _run(client, py, "'next'")
        assert after.is_error and "reply channel" in after.content and "'real'" not in after.content
        assert (await _run(client, py, "'in step'")).content.endswith("'in step'")
        assert (await _run(client, other, "kept")).content == "'other session'"
        await _healthy(client)


@pytest.mark.fault
async def test_10_mb_without_a_newline_on_the_reply_channel_ends_the_call_at_once() -> None:
    """A reply without its end hung the call until the client's deadline, reported as an infrastructure
    failure; it is the code's fault, a tool error, and the session restarts."""
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        started = time.monotonic()
        result = await _run(client, py, _EVERY_FD + "for fd in fds:\n    try:\n        os.write(fd, b'x' * 10_000_000)"
                            "\n    except OSError:\n        pass")
        assert result.is_error and "reply channel" in result.content
        assert time.monotonic() - started < 10
        assert (await _run(client, py, "'again'")).content.endswith("'again'")
        await _healthy(client)


@pytest.mark.fault
async def test_large_unicode_output_is_truncated_in_bytes_and_the_session_keeps_its_variables() -> None:
    """16,000 emoji are within the output bound in characters, but their JSON-escaped reply overflowed the
    channel and killed the session with its variables."""
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        await _run(client, py, "kept = 1")
        result = await _run(client, py, "print('\\U0001F600' * 16000)")
        assert not result.is_error, result.content[-300:]
        assert "[output truncated: 64001 bytes printed, 16384 kept]" in result.content
        assert len(result.content.encode()) < 16384 + 200
        assert (await _run(client, py, "kept")).content == "1"


def test_killing_the_tool_server_mid_call_is_an_infrastructure_failure() -> None:
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "agentloop"), "tools", "serve", "--config", str(BUILTIN), "--port", "0",
         "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = process.stdout.readline().split()[-1]

        async def scenario() -> None:
            client = GrpcToolClient(address, timeout_s=30)
            py = await client.create_instance("python", "t")
            call = asyncio.create_task(_run(client, py, "import time; time.sleep(20)"))
            await asyncio.sleep(1.0)
            process.send_signal(signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(ToolInfrastructureError, match="UNAVAILABLE"):
                await call
            assert time.monotonic() - started < 5  # no hang
            await client.close()

        import asyncio

        asyncio.run(scenario())
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.fault
async def test_a_call_its_caller_gave_up_on_does_not_answer_the_next_call() -> None:
    async with tool_server() as (server, _):
        impatient = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=1)
        try:
            py = await impatient.create_instance("python", "t")
            with pytest.raises(ToolInfrastructureError, match="DEADLINE_EXCEEDED"):
                await _run(impatient, py, "import time; time.sleep(2); 'late'")
            await asyncio.sleep(2)
            assert (await _run(impatient, py, "'next'")).content.endswith("'next'")
        finally:
            await impatient.close()


_FILL = """import errno, os
def fill(folder):
    written = 0
    for i in range(64):
        try:
            with open(f'{folder}/fill-{i}', 'wb') as f:
                f.write(b'x' * (4 * 1024 * 1024))
        except OSError as error:
            return written // 2**20, errno.errorcode[error.errno]
        written += 4 * 1024 * 1024
    return written // 2**20, None
"""


@pytest.mark.fault
async def test_the_tmpfs_and_the_work_folder_have_total_quotas() -> None:
    """One call wrote 320 MB to each (host RAM and host disk); a few sessions doing it exhaust the host."""
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        quota_mib = SandboxLimits().work_bytes // 2**20
        assert SandboxLimits().tmp_bytes // 2**20 == quota_mib
        other = await client.create_instance("python", "t2")  # the quota is each session's own
        for instance, folder in ((py, "/tmp"), (py, "/work"), (other, "/work")):
            written, error = ast.literal_eval((await _run(client, instance, _FILL + f"fill({folder!r})")).content)
            assert quota_mib - 8 <= written <= quota_mib and error == "ENOSPC", (folder, written, error)
        await _healthy(client)


@pytest.mark.fault
async def test_a_stopped_tool_server_leaves_no_sandbox_folder_behind() -> None:
    before = set(Path(tempfile.gettempdir()).glob("agentloop-sandboxes-*"))
    async with tool_server() as (_, client):
        py = await client.create_instance("python", "t")
        assert (await _run(client, py, "open('kept.txt', 'w').write('x')")).content == "1"
    assert set(Path(tempfile.gettempdir()).glob("agentloop-sandboxes-*")) == before
