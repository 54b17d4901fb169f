"""A server decodes a request's images off its event loop: while a large picture decodes, other calls go on."""

from __future__ import annotations

import asyncio

import grpc

from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from ..multimodal.pictures import png


async def test_other_calls_are_answered_while_an_image_decodes() -> None:
    picture = png((10, 200, 30), (3000, 3000))  # a few KB that take a good fraction of a second to decode
    server = await create_server(make_adapter("fake", {}), "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            request = generation_pb2.GenerateRequest(
                request_id="big-picture", prompt_ids=[1, 2, *[7] * 19, 3],
                media=[generation_pb2.MediaInput(mime_type="image/png", data=picture, offset=2, length=19)],
                sampling_params=generation_pb2.SamplingParams(max_new_tokens=1, ignore_eos=True),
            )
            await stub.GetLoad(generation_pb2.GetLoadRequest(), timeout=10)  # the channel is up
            generation = asyncio.ensure_future(stub.GenerateUnary(
                generation_pb2.GenerateUnaryRequest(request=request), timeout=60))
            answered = 0
            while not generation.done():
                await stub.GetLoad(generation_pb2.GetLoadRequest(), timeout=10)
                answered += 0 if generation.done() else 1
            assert (await generation).complete.prompt_images == 1
    finally:
        await server.stop(grace_s=1)
    # decoding on the loop would answer at most the call that waited behind it before the generation ended
    assert answered >= 5, answered
