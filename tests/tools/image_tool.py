"""A test-only tool that returns an image, to check images cross the contract."""

from agentloop_grpc.tools.result import ToolImage, ToolResult

PNG_HEADER = b"\x89PNG\r\n\x1a\n"


def plot(title: str) -> ToolResult:
    """Return a (fake) PNG with a caption.

    Args:
        title: The caption.
    """
    return ToolResult(content=f"plotted {title}", images=(ToolImage("image/png", PNG_HEADER + title.encode()),))
