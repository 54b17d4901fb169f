"""`agentloop engine serve` as a user runs it: a real process on loopback, health, reflection, SIGTERM drain."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

AGENTLOOP = str(Path(sys.executable).parent / "agentloop")


class ServerProcess:
    """An engine server process started with ``--port 0``; the port is read from its first line."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [AGENTLOOP, "engine", "serve", "--adapter", "fake", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line + self.process.stderr.read()
        self.address = line.split()[4]

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    process = ServerProcess("--set", "token_latency_s=0.01", "--drain-timeout", "10")
    yield process
    if process.process.poll() is None:
        process.process.kill()
        process.process.wait()


async def _wait_serving(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(100):
            # typeshed's HealthStub declares no methods
            status = (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status  # type: ignore[attr-defined]
            if status == health_pb2.HealthCheckResponse.SERVING:
                return status
            await asyncio.sleep(0.05)
        return status


async def test_serve_reports_health_and_lists_services_by_reflection(server: ServerProcess) -> None:
    assert await _wait_serving(server.address) == health_pb2.HealthCheckResponse.SERVING

    def services() -> list[str]:
        with grpc.insecure_channel(server.address) as channel:
            return ProtoReflectionDescriptorDatabase(channel).get_services()

    listed = await asyncio.to_thread(services)
    assert {"agentloop.v1.TokenGenerate", "agentloop.v1.EngineControl", "grpc.health.v1.Health"} <= set(listed)
    assert server.stop() == 0


async def _sigterm_mid_stream(server: ServerProcess, request_id: str, tokens: int) -> list:
    """Start a generation, SIGTERM the server after its first chunk, return every message of the stream."""
    await _wait_serving(server.address)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = generation_pb2_grpc.TokenGenerateStub(channel)
        request = generation_pb2.GenerateRequest(
            request_id=request_id,
            prompt_ids=[1, 2, 3],
            sampling_params=generation_pb2.SamplingParams(max_new_tokens=tokens, ignore_eos=True),
        )
        call = stub.Generate(request, timeout=60)
        messages = [await call.read()]
        server.process.send_signal(signal.SIGTERM)
        while (message := await call.read()) is not grpc.aio.EOF:
            messages.append(message)
    return messages


async def test_sigterm_lets_in_flight_streams_finish_and_exits_zero(server: ServerProcess) -> None:
    messages = await _sigterm_mid_stream(server, "drain-1", 60)
    assert messages[-1].complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert sum(len(m.chunk.token_ids) for m in messages[:-1]) == 60
    assert await asyncio.to_thread(server.process.wait, 30) == 0


async def test_drain_timeout_aborts_what_is_left_with_a_final_message() -> None:
    server = ServerProcess("--set", "token_latency_s=0.01", "--drain-timeout", "0.3")
    try:
        messages = await _sigterm_mid_stream(server, "drain-2", 3000)
        assert messages[-1].complete.finish_reason == generation_pb2.FINISH_REASON_ABORT
        assert 0 < messages[-1].complete.completion_tokens < 3000
        assert await asyncio.to_thread(server.process.wait, 30) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_port_in_use_is_a_clear_error(server: ServerProcess) -> None:
    port = server.address.split(":")[1]
    result = subprocess.run(
        [AGENTLOOP, "engine", "serve", "--adapter", "fake", "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


async def test_embedded_adapter_serves_from_the_cli() -> None:
    """`agentloop engine serve --adapter embedded` prepares (or finds) the default model and serves it."""
    process = subprocess.Popen(
        [AGENTLOOP, "engine", "serve", "--adapter", "embedded", "--port", "0", "--set", "max_running=2",
         "--set", "max_model_len=512", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        address = process.stdout.readline().split()[4]
        for _ in range(1200):  # loading takes seconds (about 20 s the first time: the model is converted)
            if await _wait_serving(address) == health_pb2.HealthCheckResponse.SERVING:
                break
        async with grpc.aio.insecure_channel(address) as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            request = generation_pb2.GenerateRequest(
                request_id="cli-embedded",
                prompt_ids=[1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198],
                sampling_params=generation_pb2.SamplingParams(max_new_tokens=4, temperature=0, logprobs=True),
            )
            messages = [m async for m in stub.Generate(request, timeout=120)]
        assert messages[-1].WhichOneof("response") == "complete"
        assert sum(len(m.chunk.token_ids) for m in messages[:-1]) == messages[-1].complete.completion_tokens > 0
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
