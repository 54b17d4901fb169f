"""verl's pictures as agentloop.v1 media (``GenerateRequest.media``).

verl's loops hand their server prompt ids that the model's processor already expanded, with the pictures
(``image_data``) but not where each one sits in the ids. agentloop.v1 needs each picture's span, so it is found
here the way it was made: the same processor expands each picture alone, and that run of ids is looked for in the
prompt, picture after picture, in order. A prompt that shows more or fewer pictures than ``image_data`` carries is
refused, naming the picture or the position; the ids are sent as they are (never re-tokenized).

A picture is a PIL image (what verl's loops pass: sent as PNG) or the bytes of an encoded image (sent as they are,
their format read from their header). verl's tool loop passes every picture of the trajectory on every turn, so a
picture's encoding and expansion are kept for the calls after (a bounded cache keyed by the picture object).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentloop_grpc.agent.images import Picture
from agentloop_grpc.common.media import ImageError, ImageExpander, MediaInput, encode_png, stray_image_token

#: Pictures whose encoding and expansion are kept: a tool loop's pictures of a few trajectories at once.
CACHED_PICTURES = 256


@dataclass(frozen=True, slots=True)
class _Encoded:
    picture: Any  # held so that its id() is not reused while the entry is cached
    mime_type: str
    data: bytes
    ids: tuple[int, ...]


class PictureSpans:
    """Turns verl's ``image_data`` and the prompt ids it goes with into ``MediaInput``s (see the module docstring).
    Thread-safe: verl's client calls it from worker threads."""

    def __init__(self, expander: ImageExpander) -> None:
        self.expander = expander
        self._cache: OrderedDict[int, _Encoded] = OrderedDict()
        self._lock = threading.Lock()

    def media(self, prompt_ids: Sequence[int], pictures: Sequence[Any]) -> tuple[MediaInput, ...]:
        """One ``MediaInput`` per picture, its span where the processor's expansion of it lies in ``prompt_ids``
        (after the previous picture's); ValueError naming ``image_data[i]`` or the position where the prompt and
        the pictures disagree."""
        ids = list(prompt_ids)
        media, cursor = [], 0
        for i, picture in enumerate(pictures):
            encoded = self._encoded(i, picture)
            offset = _find(ids, encoded.ids, cursor)
            if offset < 0:
                raise ValueError(
                    f"image_data[{i}]: the processor's expansion of this picture ({len(encoded.ids)} ids) is not in "
                    f"prompt_ids after position {cursor}: the prompt shows fewer pictures than image_data's "
                    f"{len(pictures)}, or was expanded by another processor")
            media.append(MediaInput(encoded.mime_type, encoded.data, offset, len(encoded.ids)))
            cursor = offset + len(encoded.ids)
        stray = stray_image_token(ids, self.expander.image_token_id, media)
        if stray is not None:
            raise ValueError(
                f"prompt_ids hold the image placeholder {self.expander.image_token!r} (id "
                f"{self.expander.image_token_id}) at position {stray}, outside the spans of image_data's "
                f"{len(pictures)} picture(s): the prompt shows more pictures than image_data carries")
        return tuple(media)

    def _encoded(self, index: int, picture: Any) -> _Encoded:
        with self._lock:
            cached = self._cache.get(id(picture))
            if cached is not None and cached.picture is picture:
                self._cache.move_to_end(id(picture))
                return cached
        encoded_picture = encode_picture(picture, f"image_data[{index}]")
        ids = self.expander.expand(encoded_picture.image).ids  # the picture as the server decodes it: its expansion
        encoded = _Encoded(picture, encoded_picture.mime_type, encoded_picture.data, ids)
        with self._lock:
            self._cache[id(picture)] = encoded
            while len(self._cache) > CACHED_PICTURES:
                self._cache.popitem(last=False)
        return encoded


def encode_picture(picture: Any, name: str) -> Picture:
    """One of verl's pictures as the contract takes it: a PIL image as PNG, the bytes of an encoded image as they
    are (their format read from their header, their bounds checked); ValueError naming it ``name`` says why not."""
    from PIL import Image

    if isinstance(picture, Image.Image):
        return Picture("image/png", encode_png(picture), picture.convert("RGB"))
    if not isinstance(picture, (bytes, bytearray, memoryview)):
        raise ValueError(f"{name} is a {type(picture).__name__}: pictures are PIL images or the bytes of an encoded "
                         f"image")
    try:
        return Picture.decode(bytes(picture))
    except ImageError as error:
        raise ValueError(f"{name}: {error}") from None


def _find(ids: list[int], part: tuple[int, ...], start: int) -> int:
    """Where ``part`` first occurs in ``ids`` at or after ``start``; -1 when it does not."""
    first, size = part[0], len(part)
    index = start
    while True:
        try:
            index = ids.index(first, index)
        except ValueError:
            return -1
        if tuple(ids[index:index + size]) == part:
            return index
        index += 1
