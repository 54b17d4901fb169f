"""A prompt's images in vLLM's terms: spans collapsed to one placeholder, pictures as multi-modal data.

Our prompts carry each image already expanded (``MediaInput`` in generation.proto), but vLLM's multi-modal
processor always expands every image placeholder id it finds, even in a token prompt: sent as they are, the
expanded ids would be expanded again. So each span becomes the one id the model's processor expands (its
``image_token``), the decoded pictures go in ``multi_modal_data`` in span order, and each picture's digest is its
``multi_modal_uuids`` entry: vLLM keys its processor cache, encoder cache and prefix cache by it, so two prompts
with the same ids and other pictures never share a block. vLLM's re-expansion must give back the request's ids
(token fidelity: the ids recorded are the ids the model ran); ``check_expansion`` compares them with the prompt
vLLM reports, and a span that is not vLLM's expansion of its image is the client's error.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.inputs import TokensPrompt

from agentloop_grpc.common.media import MediaInput

from .. import validation
from ..image_placeholders import collapse_images
from ..validation import decoded_images


def tokens_prompt(prompt_ids: Sequence[int], media: Sequence[MediaInput], image_token_id: int) -> TokensPrompt:
    """The TokensPrompt vLLM expands back to ``prompt_ids``; decodes every image (CPU time: call off the loop)."""
    return TokensPrompt(
        prompt_token_ids=collapse_images(prompt_ids, media, image_token_id),
        multi_modal_data={"image": decoded_images(media)},
        multi_modal_uuids={"image": [item.digest().hex() for item in media]},
    )


def check_expansion(prompt_ids: Sequence[int], media: Sequence[MediaInput], engine_ids: Sequence[int]) -> None:
    """InvalidRequestError naming the first image whose span is not vLLM's expansion of it, when the prompt vLLM
    runs (``engine_ids``) differs from the request's."""
    if list(engine_ids) == list(prompt_ids):
        return
    differs = next((i for i, (a, b) in enumerate(zip(engine_ids, prompt_ids)) if a != b),
                   min(len(engine_ids), len(prompt_ids)))
    # The text between spans is sent as it is, so the first difference lies in or after the span that caused it.
    index = max((i for i, item in enumerate(media) if item.offset <= differs), default=0)
    item = media[index]
    raise validation.invalid(
        validation.MEDIA_NOT_EXPANDED, index=index, start=item.offset, end=item.end, engine="vLLM", differs=differs,
        expanded=len(engine_ids), length=len(prompt_ids),
    )
