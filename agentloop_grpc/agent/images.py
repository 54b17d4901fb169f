"""Images in a conversation: content parts, how an image part names its picture, and the three views of a message.

A message's content is a string or a list of parts (OpenAI/Hugging Face style): ``{"type": "text", "text": ...}``
and ``{"type": "image", "image": ...}``, where the image is a file path (a dataset makes relative paths absolute),
a data URL (``data:image/png;base64,...``), raw bytes (Parquet) or a ``Picture`` (a tool's image, already read).
``read_images`` turns a list of messages into the view the chat template renders (image parts as a bare
``{"type": "image"}``, text-only part lists as one string, so text-only templates render them as before) and the
pictures in conversation order; ``for_humans`` is the trajectory's view, where an image part names its index in
``Trajectory.media`` instead of carrying bytes.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop_grpc.common.media import IMAGE_MIME_TYPES, MAX_IMAGE_BYTES, ImageError, decode_image

if TYPE_CHECKING:
    from PIL.Image import Image

_MIME_OF_FORMAT = {fmt: mime for mime, fmt in IMAGE_MIME_TYPES.items()}


@dataclass(frozen=True, slots=True)
class Picture:
    """One image of a conversation: its encoded bytes, their MIME type and the decoded picture."""

    mime_type: str
    data: bytes = field(repr=False)
    image: Image = field(repr=False, compare=False)

    @classmethod
    def decode(cls, data: bytes, mime_type: str | None = None) -> Picture:
        """Check ``data`` with the contract's bounds (ImageError), and that it is the ``mime_type`` it claims when
        one is given (an engine trusts the type it is sent)."""
        if len(data) > MAX_IMAGE_BYTES:  # refused before it is opened
            raise ImageError(f"the image has {len(data)} bytes, more than {MAX_IMAGE_BYTES} (8 MiB)")
        actual = _sniff(data)
        if mime_type is not None and mime_type != actual:
            raise ImageError(f"the data is {actual}, not {mime_type} as it says")
        return cls(actual, data, decode_image(data, actual))


def _sniff(data: bytes) -> str:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            fmt = opened.format
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ImageError(f"the data does not decode as an image ({type(error).__name__}: {error})") from None
    if fmt not in _MIME_OF_FORMAT:
        raise ImageError(f"the data is a {fmt} image, not one of {', '.join(IMAGE_MIME_TYPES)}")
    return _MIME_OF_FORMAT[fmt]


def read_picture(value: Any) -> Picture:
    """The picture an image part names (see the module docstring); ImageError says what is wrong with it."""
    if isinstance(value, Picture):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Picture.decode(bytes(value))
    if not isinstance(value, str) or not value:
        raise ImageError(f"an image is a file path, a data URL or bytes, not {type(value).__name__}")
    if value.startswith("data:"):
        header, comma, payload = value.partition(",")
        mime_type, _, encoding = header[len("data:"):].partition(";")
        if not comma or encoding != "base64":
            raise ImageError("a data URL must read data:<mime type>;base64,<data>")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as error:
            raise ImageError(f"the data URL is not valid base64 ({error})") from None
        return Picture.decode(data, mime_type)
    path = Path(value)
    if not path.is_file():
        raise ImageError(f"no image file {path}")
    if path.stat().st_size > MAX_IMAGE_BYTES:  # refused before it is read
        raise ImageError(f"{path} has {path.stat().st_size} bytes, more than {MAX_IMAGE_BYTES} (8 MiB)")
    return Picture.decode(path.read_bytes())


def has_parts(message: dict[str, Any]) -> bool:
    return isinstance(message.get("content"), list)


def read_images(messages: Sequence[dict[str, Any]], where: str = "messages",
                first: int = 0) -> tuple[list[dict[str, Any]], list[Picture]]:
    """The template's view of ``messages`` and their pictures in order; an unreadable picture raises ImageError
    naming it (``where[i].content[j]``, i counted from ``first``)."""
    rendered, pictures = [], []
    for i, message in enumerate(messages, start=first):
        if not has_parts(message):
            rendered.append(dict(message))
            continue
        parts = []
        for j, part in enumerate(message["content"]):
            if part.get("type") == "image":
                try:
                    pictures.append(read_picture(part.get("image")))
                except ImageError as error:
                    raise ImageError(f"{where}[{i}].content[{j}]: {error}") from None
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": part.get("text") or ""})
        content: str | list[dict[str, str]] = parts
        if all(p["type"] == "text" for p in parts):  # text-only templates render strings only
            content = "".join(p["text"] for p in parts)
        rendered.append({**message, "content": content})
    return rendered, pictures


def for_humans(messages: Sequence[dict[str, Any]], first_media: int) -> list[dict[str, Any]]:
    """``messages`` with each image part naming its index in the trajectory's media (from ``first_media`` on)
    instead of its picture, so the conversation stays plain JSON."""
    out, index = [], first_media
    for message in messages:
        if not has_parts(message):
            out.append(dict(message))
            continue
        parts = []
        for part in message["content"]:
            if part.get("type") == "image":
                parts.append({"type": "image", "media": index})
                index += 1
            else:
                parts.append({"type": "text", "text": part.get("text") or ""})
        out.append({**message, "content": parts})
    return out


def unread(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` of a sample whose pictures were never read (its loop failed early), as plain JSON: an image
    part keeps a file path, bytes and data URLs are dropped."""
    def part(p: dict[str, Any]) -> dict[str, Any]:
        image = p.get("image") if p.get("type") == "image" else None
        if image is None:
            return dict(p)
        kept = isinstance(image, str) and not image.startswith("data:")
        return {"type": "image", "image": image} if kept else {"type": "image"}

    return [{**m, "content": [part(p) for p in m["content"]]} if has_parts(m) else dict(m) for m in messages]
