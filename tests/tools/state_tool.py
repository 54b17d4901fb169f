"""Test-only tools: one reads the loop's state it asks for (a LoopSnapshot parameter), one reports metrics."""

from agentloop_grpc.tools.result import LoopSnapshot, ToolResult


def whoami(question: str, loop: LoopSnapshot) -> ToolResult:
    """Say which trajectory and turn called, and what the conversation holds so far.

    Args:
        question: Anything; the answer does not depend on it.
    """
    first_user = next(m["content"] for m in loop.messages if m["role"] == "user")
    return ToolResult(content=f"{loop.trajectory_id} turn {loop.turn} after {len(loop.messages)} messages; "
                              f"asked: {first_user}", metrics={"messages": float(len(loop.messages))})


async def measure(text: str) -> ToolResult:
    """Count the characters of a text.

    Args:
        text: The text.
    """
    return ToolResult(content=str(len(text)), metrics={"chars": float(len(text))})
