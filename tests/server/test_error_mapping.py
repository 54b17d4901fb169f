"""An engine bug becomes INTERNAL with its reason, and the server keeps serving other calls."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.engine_adapters.types import GenerateEvent, GenerateRequest
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc


class FakeEngineWithABug(FakeEngine):
    """Test-only fake: fails with an unexpected exception after one token for prompts starting with 666."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        async for event in super().generate(request):
            yield event
            if request.prompt_ids[0] == 666:
                raise ZeroDivisionError("engine bug")


async def test_unexpected_adapter_error_is_internal_and_server_stays_up() -> None:
    engine = FakeEngineWithABug()
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            params = generation_pb2.SamplingParams(max_new_tokens=5, ignore_eos=True)
            bad = stub.Generate(generation_pb2.GenerateRequest(request_id="x", prompt_ids=[666], sampling_params=params))
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
