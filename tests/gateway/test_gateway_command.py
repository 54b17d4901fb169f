"""`agentloop gateway` as a user runs it: over a running engine server, a port picked by the system, tokens from
files, stopped by SIGTERM; bad options end in one line."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import openai

from ..router.conftest import AGENTLOOP, ServerProcess


def start_gateway(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([AGENTLOOP, "gateway", "--port", "0", "--log-level", "WARNING", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        raise AssertionError(f"the gateway did not start: {line!r} {process.stderr.read()}")
    return process, line.split()[4]


async def test_the_gateway_command_serves_sessions_and_stops_on_sigterm(server_processes, tmp_path):
    program = (AGENTLOOP, "engine", "serve", "--set", "vocab_size=49152")
    server_processes.append(ServerProcess(token_latency_ms=1, program=program))
    (tmp_path / "token").write_text("secret\n")
    (tmp_path / "gateway.yaml").write_text("sampling:\n  max_tokens_per_turn: 8\n")
    process, url = start_gateway("--engines", server_processes[0].address, "--config", str(tmp_path / "gateway.yaml"),
                                 "--auth-token-file", str(tmp_path / "token"))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/sessions/c1/v1", api_key="secret") as client:
            reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
            assert reply.usage.completion_tokens <= 8 and len(reply.model_extra["agentloop"]["token_ids"]) <= 8
            assert [m.id for m in (await client.models.list()).data] == ["agentloop"]
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    assert code == 0


async def test_a_discovery_files_tokens_reach_the_engines(server_processes, tmp_path):
    """The gateway reaches the engines of a discovery file as the file says (here: with its token file), and
    follows the file while serving."""
    from agentloop_grpc.client_security import ClientSecurity
    from agentloop_grpc.launch.launcher import write_discovery

    (tmp_path / "engine-token").write_text("engine-secret\n")
    program = (AGENTLOOP, "engine", "serve", "--set", "vocab_size=49152", "--auth-token-file",
               str(tmp_path / "engine-token"))
    server_processes.append(ServerProcess(token_latency_ms=1, program=program))
    discovery = write_discovery(tmp_path / "discovery.json", [{"address": server_processes[0].address}],
                                ClientSecurity(token_file=str(tmp_path / "engine-token")))
    process, url = start_gateway("--discovery-file", str(discovery))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/sessions/c1/v1", api_key="unused") as client:
            reply = await client.chat.completions.create(model="m", max_tokens=4,
                                                         messages=[{"role": "user", "content": "Hi"}])
        assert 0 < reply.usage.completion_tokens <= 4
        # the launcher restarted the server elsewhere (its new address in the file), the old one is gone: the
        # gateway follows the file, so a new session is served
        server_processes.append(ServerProcess(token_latency_ms=1, program=program))
        write_discovery(discovery, [{"address": server_processes[1].address}],
                        ClientSecurity(token_file=str(tmp_path / "engine-token")))
        server_processes[0].stop()
        async with openai.AsyncOpenAI(base_url=f"{url}/sessions/c2/v1", api_key="unused", timeout=60,
                                      max_retries=0) as client:
            reply = await client.chat.completions.create(model="m", max_tokens=4,
                                                         messages=[{"role": "user", "content": "Hi again"}])
        assert 0 < reply.usage.completion_tokens <= 4
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    assert code == 0


def test_bad_options_end_in_one_line(tmp_path):
    cases = [
        ([], "--engines or --discovery-file"),
        (["--engines", "127.0.0.1:1", "--config", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["--engines", "127.0.0.1:1", "--tls-cert", str(tmp_path / "c.pem")], "both a certificate and its key"),
    ]
    (tmp_path / "bad.yaml").write_text("tool_parser: nope\n")
    cases.append((["--engines", "127.0.0.1:1", "--config", str(tmp_path / "bad.yaml")], "tool_parser"))
    for args, expected in cases:
        done = subprocess.run([AGENTLOOP, "gateway", "--port", "0", *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], (args, done.stderr)
