"""Images in the embedded engine: a prompt's pictures checked against the model's own expansion, then run through
the model's vision encoder and connector and placed at their spans' image-token positions during prefill.

A request's images are read before it is admitted (``ImageReader.read``, in a thread: PIL and numpy only): each is
decoded, expanded by the checkpoint's processor, and its span in ``prompt_ids`` must be exactly that expansion, so
the ids the client recorded are the ids the model runs. The image-token id may appear nowhere else (another engine,
vLLM, would expand it). At admission the scheduler turns the images into features on the worker thread, the only
thread that runs torch (``features``), skipping images the prefix-cache hit covers completely. Prefill then writes
each chunk's share of them over the token embeddings (``ImageFeatures.within``): the features fill the image-token
positions of the spans in order, as transformers' ``masked_scatter`` merge does, whatever the chunking and wherever
a cache hit ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.media import ImageExpander, check_spans, stray_image_token
from agentloop_grpc.common.types import GenerateRequest

from ..validation import decoded_images


@dataclass(frozen=True, slots=True)
class PromptImages:
    """A request's images as the processor prepared them."""

    #: Per image: the processor's tensors (numpy, e.g. pixel_values), the span's end, and the absolute prompt
    #: positions of its image-token ids.
    inputs: tuple[dict[str, Any], ...]
    ends: tuple[int, ...]
    positions: tuple[np.ndarray, ...]


@dataclass(frozen=True, slots=True)
class ImageFeatures:
    """The vision features of a prompt's image tokens, one row per absolute prompt position in ``positions``."""

    positions: torch.Tensor  # [n] long, ascending
    rows: torch.Tensor  # [n, hidden]

    def within(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The chunk ``[start, end)``'s share: (indexes within the chunk, feature rows), or None if it has none."""
        inside = (self.positions >= start) & (self.positions < end)
        if not bool(inside.any()):
            return None
        return self.positions[inside] - start, self.rows[inside]


class ImageReader:
    """Reads a request's images against the model's processor (see the module docstring)."""

    def __init__(self, expander: ImageExpander) -> None:
        self.expander = expander

    def read(self, request: GenerateRequest) -> PromptImages:
        """The request's prepared images; InvalidRequestError naming ``media[i]`` (or the stray prompt id) when the
        prompt does not carry them as this model expands them."""
        ids = request.prompt_ids.numpy()
        media = request.media
        problem = check_spans(media, len(ids))
        if problem is not None:
            raise InvalidRequestError(problem)
        image_id = self.expander.image_token_id
        inputs, positions = [], []
        for i, (item, image) in enumerate(zip(media, decoded_images(media), strict=True)):
            expansion = self.expander.expand(image)
            span = tuple(int(t) for t in ids[item.offset : item.end])
            if span != expansion.ids:
                raise InvalidRequestError(
                    f"media[{i}]: the span [{item.offset}, {item.end}) of prompt_ids differs from the model's "
                    f"expansion of the image ({len(expansion.ids)} ids: {_show(expansion.ids)}; the span holds "
                    f"{len(span)}: {_show(span)})"
                )
            inputs.append(expansion.inputs)
            positions.append(item.offset + np.flatnonzero(ids[item.offset : item.end] == image_id))
        index = stray_image_token(ids, image_id, media)
        if index is not None:
            raise InvalidRequestError(
                f"prompt_ids[{index}] is the image token {self.expander.image_token} ({image_id}) outside every "
                f"media span; an image's placeholder ids must be the span of one media item"
            )
        return PromptImages(tuple(inputs), tuple(item.end for item in media), tuple(positions))


def _show(ids: tuple[int, ...]) -> str:
    """A short form of a span's ids for error messages (spans are tens to thousands of ids long)."""
    return str(list(ids)) if len(ids) <= 8 else f"[{', '.join(map(str, ids[:4]))}, ..., {ids[-1]}]"


def features(model: torch.nn.Module, images: PromptImages, computed: int) -> ImageFeatures:
    """The features of the images whose span ends after ``computed`` (the prefix already in the slot). Worker
    thread only: it runs the vision encoder and connector."""
    positions, rows = [], []
    device = next(model.parameters()).device
    for inputs, end, where in zip(images.inputs, images.ends, images.positions):
        if end <= computed:
            continue
        tensors = {key: torch.from_numpy(value).to(device) for key, value in inputs.items()}
        with torch.inference_mode():
            out = model.get_image_features(**tensors).pooler_output
        out = out.reshape(-1, out.shape[-1])
        if out.shape[0] != len(where):
            raise RuntimeError(f"the vision model made {out.shape[0]} feature rows for {len(where)} image tokens")
        positions.append(torch.from_numpy(where))
        rows.append(out)
    if not rows:
        return ImageFeatures(torch.empty(0, dtype=torch.long), torch.empty(0))
    return ImageFeatures(torch.cat(positions), torch.cat(rows))
