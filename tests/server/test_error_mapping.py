"""An engine bug becomes INTERNAL with its reason, and the server keeps serving other calls; every status reaches the
client with its code and a bounded message."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import grpc
import pytest

from agentloop_grpc.common.errors import DuplicateRequestError, InvalidRequestError
from agentloop_grpc.common.types import GenerateEvent, GenerateRequest
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc


class FakeEngineWithABug(FakeEngine):
    """Test-only fake: fails with an unexpected exception after one token for prompts starting with 666."""

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        async for event in super().generate(request):
            yield event
            if request.prompt_ids[0] == 666:
                raise ZeroDivisionError("engine bug")


@pytest.mark.fault
async def test_unexpected_adapter_error_is_internal_and_server_stays_up() -> None:
    engine = FakeEngineWithABug()
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            params = generation_pb2.SamplingParams(max_new_tokens=5, ignore_eos=True)
            request = generation_pb2.GenerateRequest(request_id="x", prompt_ids=[666], sampling_params=params)
            bad = stub.Generate(request)
            received = []
            try:
                async for message in bad:
                    received.append(message)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.INTERNAL
                assert "ZeroDivisionError: engine bug" in error.details()
            else:
                raise AssertionError("the stream should have failed")
            assert len(received) == 1  # the token before the failure was delivered
            good = [
                m
                async for m in stub.Generate(
                    generation_pb2.GenerateRequest(request_id="y", prompt_ids=[5], sampling_params=params)
                )
            ]
            assert good[-1].complete.completion_tokens == 5
            load = await stub.GetLoad(generation_pb2.GetLoadRequest())
            assert (load.running_requests, load.waiting_requests) == (0, 0)
    finally:
        await server.stop(grace_s=1)


class FakeEngineQuotingItsInput(FakeEngine):
    """Test-only fake: fails every request with ``error``, whose message quotes a 100 KB input whole."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        raise self.error
        yield  # an async generator, like every adapter's generate


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (DuplicateRequestError("request_id " + "x" * 100_000), grpc.StatusCode.ALREADY_EXISTS),
        (InvalidRequestError("structured_output.regex " + "é" * 50_000), grpc.StatusCode.INVALID_ARGUMENT),
        (ValueError("an engine bug quoting " + "x" * 100_000), grpc.StatusCode.INTERNAL),
    ],
)
@pytest.mark.fault
async def test_a_status_keeps_its_code_whatever_its_message_quotes(error: Exception, code: grpc.StatusCode) -> None:
    """Sent whole, a message over gRPC's metadata limit reached the client as RESOURCE_EXHAUSTED (which the Router
    retries) instead of the server's status."""
    server = await create_server(FakeEngineQuotingItsInput(error), "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            request = generation_pb2.GenerateRequest(request_id="q", prompt_ids=[5])
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for _ in stub.Generate(request, timeout=10):
                    pass
            assert failed.value.code() == code, failed.value.details()
            assert 0 < len(failed.value.details().encode()) <= 1024
            unary = stub.GenerateUnary(generation_pb2.GenerateUnaryRequest(request=request), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await unary
            assert failed.value.code() == code
    finally:
        await server.stop(grace_s=1)
