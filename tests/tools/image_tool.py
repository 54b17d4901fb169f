"""Test-only tools that return images: ``plot`` a fake PNG (the bytes cross the contract as they are), ``draw`` a
real one (the agent loop decodes it and shows it to a vision-language model)."""

from typing import Literal

from agentloop_grpc.tools.result import ToolImage, ToolResult

PNG_HEADER = b"\x89PNG\r\n\x1a\n"
#: The colours ``draw`` knows, as RGB.
COLOURS = {"red": (255, 0, 0), "green": (0, 160, 0), "blue": (0, 0, 255)}


def plot(title: str) -> ToolResult:
    """Return a (fake) PNG with a caption.

    Args:
        title: The caption.
    """
    return ToolResult(content=f"plotted {title}", images=(ToolImage("image/png", PNG_HEADER + title.encode()),))


def draw(colour: Literal["red", "green", "blue"]) -> ToolResult:
    """Draw a square of one colour and return it as a PNG.

    Args:
        colour: The square's colour.
    """
    from PIL import Image

    from agentloop_grpc.common.media import encode_png

    picture = Image.new("RGB", (48, 48), COLOURS[colour])
    return ToolResult(content=f"a {colour} square", images=(ToolImage("image/png", encode_png(picture)),))
