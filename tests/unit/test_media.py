"""common/media.py: decoding each MIME type within the contract's bounds, span checks, and the image digest."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from agentloop_grpc.common.media import (
    IMAGE_MIME_TYPES,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    ImageError,
    MediaInput,
    check_spans,
    decode_image,
)

from ..multimodal.pictures import png_claiming

RED = (255, 0, 0)
BLUE = (0, 0, 255)


def _encoded(image: Image.Image, pil_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=pil_format, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("mime_type", sorted(IMAGE_MIME_TYPES))
def test_each_mime_type_decodes_to_rgb(mime_type: str) -> None:
    data = _encoded(Image.new("RGB", (40, 30), RED), IMAGE_MIME_TYPES[mime_type])
    image = decode_image(data, mime_type)
    assert (image.mode, image.size) == ("RGB", (40, 30))
    pixel = image.getpixel((20, 15))
    assert isinstance(pixel, tuple)
    red, green, blue = pixel
    assert red > 200 and green < 60 and blue < 60  # JPEG and WEBP are lossy


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in (RED, BLUE)]
    data = _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(data)).n_frames == 2  # type: ignore[attr-defined]  # PIL declares it per format
    assert decode_image(data, "image/gif").getpixel((4, 4)) == RED


def test_grey_and_transparent_pictures_come_back_as_rgb() -> None:
    for image in (Image.new("L", (4, 4), 128), Image.new("RGBA", (4, 4), (1, 2, 3, 0))):
        assert decode_image(_encoded(image, "PNG"), "image/png").mode == "RGB"


@pytest.mark.parametrize(
    ("data", "mime_type", "needle"),
    [
        (b"GIF89a", "image/tiff", "mime_type 'image/tiff' is not one of image/png, image/jpeg"),
        (b"GIF89a", "", "mime_type '' is not one of"),
        (b"", "image/png", "data is empty"),
        (bytes(MAX_IMAGE_BYTES + 1), "image/png", f"data has {MAX_IMAGE_BYTES + 1} bytes, more than 8388608 (8 MiB)"),
        (b"not a picture at all", "image/png", "the data is not a image/png image"),
        (png_claiming(6000, 6000), "image/png", f"6000 x 6000 pixels, more than {MAX_IMAGE_PIXELS}"),
        (png_claiming(20_000, 20_000), "image/png", f"more than {MAX_IMAGE_PIXELS} pixels"),
    ],
    ids=["unknown_type", "no_type", "empty", "over_8_MiB", "not_an_image", "over_pixel_bound", "past_pils_bound"],
)
def test_bad_images_are_refused_naming_the_bound(data: bytes, mime_type: str, needle: str) -> None:
    with pytest.raises(ImageError) as refused:
        decode_image(data, mime_type)
    assert needle in str(refused.value)


def test_data_of_another_format_than_its_mime_type_is_refused() -> None:
    png = _encoded(Image.new("RGB", (4, 4), RED), "PNG")
    with pytest.raises(ImageError, match="the data is not a image/jpeg image"):
        decode_image(png, "image/jpeg")


def test_a_long_mime_type_is_quoted_short() -> None:
    with pytest.raises(ImageError) as refused:
        decode_image(b"x", "image/" + "x" * 10_000)
    assert len(str(refused.value)) < 200 and "..." in str(refused.value)


def test_damaged_images_raise_image_error_only() -> None:
    """Truncated or corrupted files of every format: each either decodes or raises ImageError (never another
    exception, which the server would report as INTERNAL)."""
    rng = random.Random(0)
    source = Image.effect_noise((32, 32), 50).convert("RGB")
    for mime_type, pil_format in IMAGE_MIME_TYPES.items():
        data = _encoded(source, pil_format)
        for attempt in range(60):
            damaged = bytearray(data)
            if attempt % 2:
                damaged = damaged[: rng.randrange(1, len(damaged))]
            else:
                for _ in range(3):
                    damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            try:
                decode_image(bytes(damaged), mime_type)
            except ImageError:
                pass


def _at(offset: int, length: int, data: bytes = b"x") -> MediaInput:
    return MediaInput("image/png", data, offset, length)


def test_spans_in_order_inside_the_prompt_pass() -> None:
    assert check_spans([_at(0, 19), _at(19, 19), _at(40, 19)], 59) is None
    assert check_spans([], 0) is None


@pytest.mark.parametrize(
    ("spans", "needle"),
    [
        ([_at(-1, 19)], "media[0]: offset must be >= 0 and length >= 1 (got offset -1, length 19)"),
        ([_at(0, 0)], "media[0]: offset must be >= 0"),
        ([_at(0, 19), _at(45, 19)], "media[1]: the span [45, 64) ends past the prompt's 59 ids"),
        ([_at(0, 19), _at(10, 19)], "media[1]: the span [10, 29) starts before the previous image's span ends (19)"),
        ([_at(30, 19), _at(0, 19)], "media[1]: the span [0, 19) starts before the previous image's span ends (49)"),
    ],
    ids=["negative_offset", "empty_span", "past_the_end", "overlapping", "out_of_order"],
)
def test_bad_spans_are_named(spans: list[MediaInput], needle: str) -> None:
    assert needle in (check_spans(spans, 59) or "")


def test_the_digest_is_of_the_bytes() -> None:
    assert _at(0, 1, b"a").digest() == _at(5, 2, b"a").digest() != _at(0, 1, b"b").digest()
    assert _at(3, 19).moved(7) == _at(7, 19)
