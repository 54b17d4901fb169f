"""Pictures for the multi-modal tests: plain colours (the tiny model's vision part is random, so any picture does)."""

from __future__ import annotations

from agentloop_grpc.common.media import encode_png


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """A picture of one colour, as PNG bytes."""
    from PIL import Image

    return encode_png(Image.new("RGB", size, colour))
