"""Images in prompts: the contract's bounds, decoding, and a processor's expansion of one image.

A prompt carries each image already expanded the way the model's processor expands its image placeholder (see
``MediaInput`` in generation.proto), so the ids a trajectory records are the ids the model ran. Clients (the agent
loop) splice ``ImageExpander.expand`` into the ids they encode and send the image with the span's place; servers
decode the image with ``decode_image`` and check the span against their own expansion. Shared by both sides, so it
imports neither client nor server code; PIL and transformers are imported when first needed.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image

#: Bytes of one encoded image at most (well under the 64 MiB message limit, so a few images fit in a request).
MAX_IMAGE_BYTES = 8 * 1024 * 1024
#: Width x height at most: a small file can decode to a huge picture (a "decompression bomb").
MAX_IMAGE_PIXELS = 32 * 1024 * 1024
#: The MIME types the contract accepts, with the format PIL reports for each.
IMAGE_MIME_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF",
                    "image/bmp": "BMP"}


class ImageError(ValueError):
    """An image the contract refuses; the message says why (the caller names the field)."""


@dataclass(frozen=True, slots=True)
class MediaInput:
    """One image of a prompt: its encoded bytes and the span ``[offset, offset + length)`` of prompt ids that
    stands for it (the processor's expansion of the image's placeholder)."""

    mime_type: str
    data: bytes = field(repr=False)
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    def digest(self) -> bytes:
        """A hash of the image's bytes: what caches key the image by (equal bytes, equal features)."""
        return hashlib.sha256(self.data).digest()

    def data_url(self) -> str:
        """The image as a ``data:<mime type>;base64,...`` URL."""
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode()}"

    def moved(self, offset: int) -> MediaInput:
        """The same image with its span starting at ``offset``."""
        return MediaInput(self.mime_type, self.data, offset, self.length)


def decode_image(data: bytes, mime_type: str) -> Image:
    """The image in ``data`` as RGB; ImageError naming the bound it breaks or why it does not decode."""
    if mime_type not in IMAGE_MIME_TYPES:
        shown = repr(mime_type[:64]) + ("..." if len(mime_type) > 64 else "")  # a status message has 1 KiB
        raise ImageError(f"mime_type {shown} is not one of {', '.join(IMAGE_MIME_TYPES)}")
    if not data:
        raise ImageError("data is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"data has {len(data)} bytes, more than {MAX_IMAGE_BYTES} (8 MiB)")
    from PIL import Image, UnidentifiedImageError

    try:
        # only the named format's decoder runs: bytes of another format are refused, not decoded by guess
        with Image.open(io.BytesIO(data), formats=(IMAGE_MIME_TYPES[mime_type],)) as opened:
            width, height = opened.size  # from the header: the size is known before decoding
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageError(f"the image is {width} x {height} pixels, more than {MAX_IMAGE_PIXELS} in all")
            opened.seek(0)  # a GIF's first frame
            return opened.convert("RGB")
    except ImageError:
        raise
    except Image.DecompressionBombError:  # PIL's own bound, far above ours, checked before we see the size
        raise ImageError(f"the image has more than {MAX_IMAGE_PIXELS} pixels (width x height)") from None
    except UnidentifiedImageError:
        raise ImageError(f"the data is not a {mime_type} image") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise ImageError(f"the data does not decode as {mime_type} ({type(error).__name__}: {error})") from None


def encode_png(image: Image) -> bytes:
    """``image`` as PNG bytes (tools and tests that draw their images)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def check_spans(media: Sequence[MediaInput], prompt_len: int) -> str | None:
    """Why the spans of ``media`` do not fit a prompt of ``prompt_len`` ids (in order, not overlapping, inside),
    naming ``media[i]``; None when they do."""
    previous_end = 0
    for i, item in enumerate(media):
        if item.offset < 0 or item.length < 1:
            return f"media[{i}]: offset must be >= 0 and length >= 1 (got offset {item.offset}, length {item.length})"
        if item.end > prompt_len:
            return f"media[{i}]: the span [{item.offset}, {item.end}) ends past the prompt's {prompt_len} ids"
        if item.offset < previous_end:
            return (f"media[{i}]: the span [{item.offset}, {item.end}) starts before the previous image's span ends "
                    f"({previous_end}); spans are in prompt order and do not overlap")
        previous_end = item.end
    return None


def stray_image_token(ids: Sequence[int] | np.ndarray, image_token_id: int, media: Sequence[MediaInput]) -> int | None:
    """The first position of ``image_token_id`` in ``ids`` outside every span of ``media`` (a placeholder no image
    stands for); None when there is none."""
    stray = np.asarray(ids) == image_token_id
    for item in media:
        stray[item.offset : item.end] = False
    found = np.flatnonzero(stray)
    return int(found[0]) if found.size else None


@dataclass(frozen=True, slots=True)
class Expansion:
    """What a processor makes of one image: the ids that replace its placeholder and its tensors (numpy arrays,
    e.g. ``pixel_values``) for the model."""

    ids: tuple[int, ...]
    inputs: dict[str, Any]


class ImageExpander:
    """A model's processor, asked about one image at a time."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token: str = processor.image_token
        self.image_token_id: int = processor.tokenizer.convert_tokens_to_ids(self.image_token)

    @classmethod
    def load(cls, model_path: str) -> ImageExpander | None:
        """The expander of the checkpoint at ``model_path``; None when its processor takes no images."""
        from transformers import AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(model_path, local_files_only=True)
        except (OSError, ValueError):
            return None
        if getattr(processor, "image_processor", None) is None or not getattr(processor, "image_token", None):
            return None
        return cls(processor)

    def expand(self, image: Image) -> Expansion:
        """The processor's expansion of ``image`` alone: its placeholder's ids and its tensors."""
        out = self.processor(text=[self.image_token], images=[[image]], add_special_tokens=False, return_tensors="np")
        ids = tuple(int(i) for i in out["input_ids"][0])
        inputs = {key: value for key, value in out.items() if key not in ("input_ids", "attention_mask")}
        return Expansion(ids, inputs)
