"""Pictures for the multi-modal tests: plain colours (the tiny model's vision part is random, so any picture does)."""

from __future__ import annotations

import io

from agentloop_grpc.common.media import encode_png


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """A picture of one colour, as PNG bytes."""
    from PIL import Image

    return encode_png(Image.new("RGB", size, colour))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, in a few bytes with no pixel data: a decompression
    bomb's header, cheap to build at any size."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def picture(data: bytes):
    """Encoded bytes as the RGB picture a processor takes."""
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")
