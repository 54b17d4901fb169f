"""A prompt's image spans collapsed to one placeholder id each: the form engines that expand images themselves take.

Our prompts carry each image already expanded (``MediaInput`` in generation.proto). vLLM and SGLang expand every
image placeholder id they find again, so the vLLM and SGLang adapters send each span as the one id the model's
processor expands (its image token) and check that the engine's expansion gives the request's length back. An
image token outside every span is refused: those engines would run it as a picture-less token (vLLM) or as one
more image (SGLang), so no recompute could reproduce what they ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentloop_grpc.common.media import MediaInput, stray_image_token
from agentloop_grpc.common.prompt import PromptIds

from . import validation


def collapse_images(prompt_ids: Sequence[int], media: Sequence[MediaInput], image_token_id: int) -> list[int]:
    """``prompt_ids`` with each span of ``media`` (in prompt order) replaced by ``image_token_id``."""
    ids: list[int] = []
    start = 0
    for item in media:
        ids += prompt_ids[start : item.offset]
        ids.append(image_token_id)
        start = item.end
    ids += prompt_ids[start:]
    return ids


def check_no_stray_image_token(prompt_ids: PromptIds, media: Sequence[MediaInput], image_token_id: int) -> None:
    """InvalidRequestError naming the first ``image_token_id`` of ``prompt_ids`` outside every span of ``media``."""
    index = stray_image_token(prompt_ids.numpy(), image_token_id, media)
    if index is not None:
        raise validation.invalid(validation.IMAGE_TOKEN_STRAY, index=index, token=image_token_id)
