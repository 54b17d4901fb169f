"""Prometheus metrics of engine and tool servers: RPCs by method and status code, latencies, in flight, refused
credentials, the engine's own gauges; served over HTTP by `--metrics-port` with the process's default registry."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.serving.metrics import ServerMetrics
from agentloop_grpc.serving.server_security import ServerSecurity
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .conftest import TOKEN, Pki

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


async def test_engine_server_counts_calls_codes_refusals_and_reports_its_state(pki: Pki) -> None:
    metrics = ServerMetrics()
    server = await create_server(FakeEngine(FakeEngineConfig()), "127.0.0.1:0",
                                 ServerSecurity(token_file=str(pki.token)), metrics)
    await start_adapter(server)
    user = (("authorization", f"Bearer {TOKEN}"),)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            generate = generation_pb2_grpc.TokenGenerateStub(channel)
            control = engine_pb2_grpc.EngineControlStub(channel)
            request = generation_pb2.GenerateRequest(
                request_id="m1", prompt_ids=[1, 2], sampling_params=generation_pb2.SamplingParams(max_new_tokens=2))
            assert [m async for m in generate.Generate(request, metadata=user, timeout=10)]
            bad = generation_pb2.GenerateRequest(request_id="m2", prompt_ids=[])
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in generate.Generate(bad, metadata=user, timeout=10):
                    pass
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError):
                    await generate.GetLoad(generation_pb2.GetLoadRequest(), timeout=10)
            await control.UpdateWeights(
                iter([engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=3))]),
                metadata=user, timeout=10)
        assert metrics.value("agentloop_server_requests_total", method="Generate", code="OK") == 1
        assert metrics.value("agentloop_server_requests_total", method="Generate", code="INVALID_ARGUMENT") == 1
        assert metrics.value("agentloop_server_requests_total", method="GetLoad", code="UNAUTHENTICATED") == 3
        assert metrics.value("agentloop_server_auth_failures_total", code="UNAUTHENTICATED") == 3
        assert metrics.value("agentloop_server_request_seconds_count", method="Generate") == 2
        assert metrics.value("agentloop_server_in_flight", method="Generate") == 0
        assert metrics.value("agentloop_engine_weight_version") == 3
        assert metrics.value("agentloop_engine_state", state="running") == 1
        assert metrics.value("agentloop_engine_state", state="sleeping") == 0
        assert metrics.value("agentloop_engine_max_running_requests") > 0
    finally:
        await server.stop(grace_s=0.5)


RUNNING = 'agentloop_engine_state{state="running"} 1.0'


@pytest.mark.parametrize("command", [["engine", "serve", "--adapter", "fake"],
                                     ["tools", "serve", "--config", "agentloop_grpc/tools/builtin.yaml"]])
def test_metrics_port_serves_prometheus_text(command: list[str]) -> None:
    process = subprocess.Popen([*AGENTLOOP, *command, "--port", "0", "--metrics-port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in process.stdout.readline()
        line = process.stdout.readline()
        assert "metrics at http://127.0.0.1:" in line, line
        url = line.split("metrics at ", 1)[1].strip()
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "agentloop_server_requests_total" in text or "# HELP agentloop_server_requests" in text
        assert "process_cpu_seconds_total" in text  # the default registry (where vLLM registers its metrics)
        if command[0] == "engine":
            # metrics are served from the moment the server listens, while the adapter may still be loading
            assert 'agentloop_engine_state{state="loading"} 1.0' in text or RUNNING in text
            deadline = time.monotonic() + 60
            while RUNNING not in text and time.monotonic() < deadline:
                time.sleep(0.05)
                text = urllib.request.urlopen(url, timeout=10).read().decode()
            assert RUNNING in text
        else:
            assert "agentloop_tool_queued_executions 0.0" in text and "agentloop_tool_max_queued_executions" in text
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
