"""A call's images (GenerateCall.media) go on the wire with every attempt: the first, and one that resumes on
another server after a failure, whose prompt grows by the tokens received while the spans stay where they were."""

from __future__ import annotations

import grpc

from agentloop_grpc.common import wire
from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.types import FinishReason, SamplingParams
from agentloop_grpc.router import GenerateCall, GenerateResult, Router
from agentloop_grpc.router.attempts import attempt_request
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from ..multimodal.pictures import png
from .conftest import address, fake_servers, sampling_proto
from .test_routing import FAST

SPAN = (5, 6) + (7,) * 16 + (5,)  # the fake takes any span; one shaped like Idefics3's 19 ids
PROMPT = [10, 11, 12, *SPAN, 13, 14, *SPAN, 15]
MEDIA = (
    MediaInput("image/png", png((255, 0, 0)), 3, len(SPAN)),
    MediaInput("image/png", png((0, 0, 255)), 24, len(SPAN)),
)
BUDGET = 100


def _greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)


def test_every_attempt_carries_the_images_at_their_spans() -> None:
    call = GenerateCall("s", PROMPT, _greedy(10), media=MEDIA)
    wanted = [generation_pb2.MediaInput(mime_type=m.mime_type, data=m.data, offset=m.offset, length=m.length)
              for m in MEDIA]
    for received in ([], [40, 41]):
        request = generation_pb2.GenerateRequest()
        attempt_request("r", call, wire.prompt_to_raw(PROMPT), received, None, into=request)
        assert list(request.media) == wanted
        assert len(request.prompt_ids_raw) // 4 == len(PROMPT) + len(received)
    assert not generation_pb2.GenerateRequest(request_id="t").media  # a call without images sends none


async def _direct(server: str, prompt: list[int], tokens: int, media: tuple[MediaInput, ...]) -> list[int]:
    """Greedy tokens of one server, called without the Router (the fake's stream depends on the pictures)."""
    async with grpc.aio.insecure_channel(server) as channel:
        request = generation_pb2.GenerateRequest(request_id="direct", prompt_ids=prompt,
                                                 sampling_params=sampling_proto(_greedy(tokens)))
        for item in media:
            request.media.add(mime_type=item.mime_type, data=item.data, offset=item.offset, length=item.length)
        stub = generation_pb2_grpc.TokenGenerateStub(channel)
        return [t async for m in stub.Generate(request, timeout=60) for t in m.chunk.token_ids]


async def test_a_generation_resumed_elsewhere_sends_the_images_again() -> None:
    async with fake_servers(2, token_latency_s=0.002) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        by_address = {address(s): s for s in servers}
        received = 0
        result = None
        async for event in router.stream(GenerateCall("pictures", PROMPT, _greedy(BUDGET), media=MEDIA)):
            if isinstance(event, GenerateResult):
                result = event
                break
            received += len(event.token_ids)
            if received >= 20 and len(by_address) == 2:  # the first server goes away mid-stream
                first = router.session_server("pictures")
                await by_address.pop(first).server.stop(0)
        survivor = next(iter(by_address))
        assert result is not None and result.finish_reason is FinishReason.LENGTH
        assert (result.failovers, result.servers, result.prompt_images) == (1, (first, survivor), 2)
        reference = await _direct(survivor, PROMPT, BUDGET, MEDIA)
        split = next(i for i, (a, b) in enumerate(zip(result.token_ids, reference)) if a != b)
        assert split >= 20
        resumed_prompt = PROMPT + list(result.token_ids[:split])
        continuation = await _direct(survivor, resumed_prompt, BUDGET - split, MEDIA)
        assert list(result.token_ids[split:]) == continuation
        assert continuation != await _direct(survivor, resumed_prompt, BUDGET - split, ())  # the pictures mattered
