"""Real engine servers on loopback for the router tests: in-process fake engines, or `agentloop engine serve`
processes where a test kills one."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.v1 import generation_pb2

AGENTLOOP = str(Path(sys.executable).parent / "agentloop")


@asynccontextmanager
async def fake_servers(count: int, **config) -> AsyncIterator[list[EngineServer]]:
    """``count`` in-process engine servers, each with its own fake engine."""
    servers = []
    try:
        for _ in range(count):
            server = await create_server(FakeEngine(FakeEngineConfig(**config)), "127.0.0.1:0")
            await start_adapter(server)
            servers.append(server)
        yield servers
    finally:
        for server in servers:
            await server.stop(grace_s=0.5)


def sampling_proto(sampling: SamplingParams) -> generation_pb2.SamplingParams:
    """``sampling`` as a request to a server called directly, without the Router, carries it."""
    message = generation_pb2.SamplingParams()
    wire.fill_sampling(message, sampling, sampling.max_new_tokens)
    return message


def address(server: EngineServer) -> str:
    return f"127.0.0.1:{server.port}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """`agentloop engine serve --adapter fake` in its own process, so a test can SIGKILL (or SIGSTOP) it.
    ``program``: another command taking the same options and printing the same first line."""

    def __init__(
        self, port: int = 0, token_latency_ms: float = 5.0, program: Sequence[str] = (AGENTLOOP, "engine", "serve")
    ) -> None:
        self.process = subprocess.Popen(
            [
                *program, "--adapter", "fake", "--port", str(port),
                "--set", f"token_latency_s={token_latency_ms / 1000}", "--log-level", "WARNING",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"server did not start: {line!r}")
        self.address = line.split()[4]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture
def server_processes() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            process.process.kill()
            process.process.wait()
