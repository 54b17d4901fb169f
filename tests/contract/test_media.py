"""Contract: images in prompts (GenerateRequest.media). A server whose model takes none answers UNIMPLEMENTED; one
that takes them counts them (GenerateComplete.prompt_images), keys its prefix cache by them, and refuses every bad
image or span with INVALID_ARGUMENT naming media[i] and the bound, staying healthy.

The pictures are plain colours: the contract is about bytes and spans, not what a model sees in them.
"""

from __future__ import annotations

import grpc
import pytest

from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import generation_pb2

from ..multimodal.pictures import png, png_claiming
from .target import ContractTarget, collect, generate_error, request

INVALID = grpc.StatusCode.INVALID_ARGUMENT
RED = png((255, 0, 0))
BLUE = png((0, 0, 255))
#: The contract's bounds (generation.proto, MediaInput).
MAX_IMAGE_BYTES = 8 * 1024 * 1024
MAX_IMAGE_PIXELS = 33_554_432


def _with_images(target: ContractTarget, pictures: list[bytes], **sampling) -> generation_pb2.GenerateRequest:
    """A request whose prompt is the target's, then one image span per picture, each followed by a few ids."""
    text = target.prompt
    prompt = list(text)
    req = request(target, prompt=[], **sampling)
    for picture in pictures:
        req.media.add(mime_type="image/png", data=picture, offset=len(prompt), length=len(target.image_tokens))
        prompt += [*target.image_tokens, *text[:3]]
    req.prompt_ids.extend(prompt)
    return req


async def _takes_images(target: ContractTarget) -> bool:
    info = await target.info()
    assert info.supports_images == (info.max_images_per_request > 0)
    return info.supports_images


async def _skip_without_images(target: ContractTarget) -> None:
    if not await _takes_images(target):
        pytest.skip(f"{target.name}'s model takes no images: every media request is UNIMPLEMENTED (tested above)")


async def _still_healthy(target: ContractTarget) -> None:
    good = await collect(target, request(target, max_new_tokens=2, ignore_eos=True))
    assert len(good.tokens) == 2
    assert (await target.wait_no_requests()).running_requests == 0


async def test_images_are_counted_or_unimplemented(engine: ContractTarget) -> None:
    if not await _takes_images(engine):
        error = await generate_error(engine, _with_images(engine, [RED], max_new_tokens=2))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error.details()
        assert error.details() == "media: this server's model takes no images"
        await _still_healthy(engine)
        return
    assert len(engine.image_tokens) > 0
    streamed = await collect(engine, _with_images(engine, [RED, BLUE], max_new_tokens=3, ignore_eos=True))
    assert streamed.complete.prompt_images == 2
    assert streamed.complete.prompt_tokens == len(engine.prompt) + 2 * (len(engine.image_tokens) + 3)
    unary = await engine.generate.GenerateUnary(
        generation_pb2.GenerateUnaryRequest(request=_with_images(engine, [RED], max_new_tokens=3, ignore_eos=True)),
        timeout=60,
    )
    assert unary.complete.prompt_images == 1
    text_only = await collect(engine, request(engine, max_new_tokens=1, ignore_eos=True))
    assert text_only.complete.prompt_images == 0


async def test_the_prefix_cache_never_crosses_another_picture(engine: ContractTarget) -> None:
    """Same ids, another picture: the cached prefix ends before the image's span; the same picture again: past it."""
    await _skip_without_images(engine)
    text = list(range(100, 132))  # 32 ids: whole blocks before the span for block sizes up to 32
    tail = list(range(200, 248))
    prompt = [*text, *engine.image_tokens, *tail]

    def with_picture(picture: bytes) -> generation_pb2.GenerateRequest:
        req = request(engine, prompt=prompt, max_new_tokens=1, ignore_eos=True)
        req.media.add(mime_type="image/png", data=picture, offset=len(text), length=len(engine.image_tokens))
        return req

    first = await collect(engine, with_picture(RED))
    other = await collect(engine, with_picture(BLUE))
    same = await collect(engine, with_picture(RED))
    assert first.complete.prompt_images == other.complete.prompt_images == same.complete.prompt_images == 1
    assert other.complete.cached_prompt_tokens <= len(text)
    assert same.complete.cached_prompt_tokens > len(text) + len(engine.image_tokens)


def _bad(target: ContractTarget, max_images: int, case: str) -> tuple[generation_pb2.GenerateRequest, list[str]]:
    """The bad request of ``case`` and the texts its error must contain."""
    span = len(target.image_tokens)
    req = _with_images(target, [RED, BLUE], max_new_tokens=2)
    second = req.media[1]
    prompt_len = len(req.prompt_ids)
    if case == "unknown_mime_type":
        second.mime_type = "image/tiff"
        return req, ["media[1]", "mime_type 'image/tiff' is not one of image/png"]
    if case == "mime_type_of_another_format":
        second.mime_type = "image/jpeg"
        return req, ["media[1]", "not a image/jpeg image"]
    if case == "empty_data":
        second.data = b""
        return req, ["media[1]", "data is empty"]
    if case == "data_over_8_MiB":
        second.data = RED + bytes(MAX_IMAGE_BYTES + 1 - len(RED))
        return req, ["media[1]", f"{MAX_IMAGE_BYTES + 1} bytes, more than {MAX_IMAGE_BYTES}"]
    if case == "undecodable":
        second.data = RED[: len(RED) // 2]
        return req, ["media[1]", "does not decode as image/png"]
    if case == "not_an_image":
        second.data = b"hello, world"
        return req, ["media[1]", "not a image/png image"]
    if case == "over_the_pixel_bound":
        second.data = png_claiming(6000, 6000)
        return req, ["media[1]", f"6000 x 6000 pixels, more than {MAX_IMAGE_PIXELS}"]
    if case == "far_over_the_pixel_bound":
        second.data = png_claiming(20_000, 20_000)
        return req, ["media[1]", f"more than {MAX_IMAGE_PIXELS} pixels"]
    if case == "span_past_the_prompt":
        second.offset = prompt_len - span + 1
        return req, ["media[1]", f"ends past the prompt's {prompt_len} ids"]
    if case == "negative_offset":
        req.media[0].offset = -1
        return req, ["media[0]", "offset must be >= 0"]
    if case == "empty_span":
        second.length = 0
        return req, ["media[1]", "length >= 1"]
    if case == "overlapping_spans":
        second.offset = req.media[0].offset + 1
        return req, ["media[1]", "starts before the previous image's span ends"]
    if case == "out_of_order":
        req.media[0].offset, second.offset = second.offset, req.media[0].offset
        return req, ["media[1]", "spans are in prompt order"]
    assert case == "too_many_images"
    many = _with_images(target, [RED] * (max_images + 1), max_new_tokens=2)
    return many, [f"media has {max_images + 1} images; at most {max_images}"]


BAD_CASES = [
    "unknown_mime_type", "mime_type_of_another_format", "empty_data", "data_over_8_MiB", "undecodable", "not_an_image",
    "over_the_pixel_bound", "far_over_the_pixel_bound", "span_past_the_prompt", "negative_offset", "empty_span",
    "overlapping_spans", "out_of_order", "too_many_images",
]


@pytest.mark.fault
@pytest.mark.parametrize("case", BAD_CASES)
async def test_a_bad_image_or_span_is_invalid_argument_naming_it(engine: ContractTarget, case: str) -> None:
    await _skip_without_images(engine)
    bad, needles = _bad(engine, (await engine.info()).max_images_per_request, case)
    error = await generate_error(engine, bad)
    assert error.code() == INVALID, error.details()
    for needle in needles:
        assert needle in error.details()
    assert len(error.details().encode()) <= 1024
    await _still_healthy(engine)


async def test_a_fake_that_takes_no_images_says_so() -> None:
    """GetServerInfo and Generate agree when a server takes no images (the fake, configured so)."""
    server = await create_server(make_adapter("fake", {"max_images_per_request": 0}), "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            target = ContractTarget("fake-no-images", "", channel, [11, 12, 13], 10, None, image_tokens=(7,) * 4)
            info = await target.info()
            assert (info.supports_images, info.max_images_per_request) == (False, 0)
            error = await generate_error(target, _with_images(target, [RED], max_new_tokens=2))
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "media: this server's model takes no images" == error.details()
            await _still_healthy(target)
    finally:
        await server.stop(grace_s=1)
