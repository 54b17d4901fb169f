"""Images through the SGLang adapter, on the stand-in engine: a request with images reaches the rank-0 actor as SGLang
takes it (each expanded span collapsed to the model's image token id, the pictures as data URLs in span order), and
a span whose length SGLang's expansion does not give back is refused before any token leaves."""

from __future__ import annotations

import base64

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2

from ..contract.target import ContractTarget, collect, generate_error, request
from ..multimodal.pictures import png
from .conftest import sglang_server, standin_group

pytestmark = pytest.mark.usefixtures("ray_cluster")

IMAGE, EXPANSION = 31_000, 3  # the stand-in's image token id and the ids it expands one image to
RED, BLUE = png((255, 0, 0)), png((0, 0, 255))
#: Text, a red picture's span, text, a blue picture's span, text.
PROMPT = [11, 12, 7, IMAGE, 8, 13, 7, IMAGE, 8, 14]


@pytest.fixture(scope="module")
async def served(ray_cluster):
    """A vision-language stand-in behind one gRPC server; yields (target, group)."""
    async with standin_group(enable_multimodal=True, image_token_id=IMAGE, image_tokens=EXPANSION) as group:
        async with sglang_server(group, max_images_per_request=2) as server:
            address = f"127.0.0.1:{server.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                yield ContractTarget("sglang-vlm", address, channel, PROMPT, 0, engine_pb2.TensorChunk()), group


def _with_images(target: ContractTarget, prompt: list[int], spans: list[tuple[bytes, int, int]]):
    req = request(target, prompt=prompt, max_new_tokens=3, temperature=0, logprobs=True)
    for data, offset, length in spans:
        req.media.add(mime_type="image/png", data=data, offset=offset, length=length)
    return req


async def test_server_info_says_the_model_takes_images(served) -> None:
    info = await served[0].info()
    assert info.supports_images and info.max_images_per_request == 2


async def test_images_reach_sglang_as_one_placeholder_each_and_data_urls(served) -> None:
    target, group = served
    req = _with_images(target, PROMPT, [(RED, 2, 3), (BLUE, 6, 3)])
    result = await collect(target, req)
    assert len(result.tokens) == 3 and result.complete.prompt_images == 2
    assert result.complete.prompt_tokens == len(PROMPT)  # SGLang's count of the ids it expanded
    call, = await group.calls("async_generate", where=lambda p: p["rid"] == req.request_id)
    assert call["input_ids"] == [11, 12, IMAGE, 13, IMAGE, 14]
    urls = call["image_data"]
    assert [url.split(",")[0] for url in urls] == ["data:image/png;base64"] * 2
    assert [base64.b64decode(url.split(",", 1)[1]) for url in urls] == [RED, BLUE]


async def test_a_span_sglang_expands_otherwise_is_refused_and_aborted(served) -> None:
    target, group = served
    short = PROMPT[:2] + [7, IMAGE, IMAGE, 8] + PROMPT[6:]  # the stand-in expands to 3 ids, not 4
    req = _with_images(target, short, [(RED, 2, 4), (BLUE, 6, 3)])
    error = await generate_error(target, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "media: SGLang's expansion of the 2 image(s) makes a prompt of 9 ids, the request has 10" in error.details()
    assert await group.calls("abort_request", where=lambda p: p["rid"] == req.request_id)
    assert len((await collect(target, _with_images(target, PROMPT, [(RED, 2, 3), (BLUE, 6, 3)]))).tokens) == 3


async def test_an_image_token_outside_every_span_is_refused(served) -> None:
    target, _ = served
    # after the last span (SGLang would read it as a third image), or in a prompt without pictures
    for prompt, spans, index in ((PROMPT[:-1] + [IMAGE], [(RED, 2, 3), (BLUE, 6, 3)], 9), ([11, IMAGE, 12], [], 1)):
        error = await generate_error(target, _with_images(target, prompt, spans))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith(f"prompt_ids[{index}] is the image token ({IMAGE}) outside every media")


async def test_a_text_model_takes_no_images(ray_cluster) -> None:
    async with standin_group() as group, sglang_server(group) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            target = ContractTarget("sglang", "", channel, PROMPT, 0, engine_pb2.TensorChunk())
            assert not (await target.info()).supports_images
            error = await generate_error(target, _with_images(target, PROMPT, [(RED, 2, 3)]))
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error.details()
