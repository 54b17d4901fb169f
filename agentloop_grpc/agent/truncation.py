"""Truncation of long tool responses before they are encoded (a model cannot use 100 KB of stdout)."""

from __future__ import annotations

from typing import Literal

MARK = "...(truncated)..."


def truncate(text: str, limit: int, side: Literal["left", "right", "middle"]) -> str:
    """Cut ``text`` to at most ``limit`` characters, marking the cut. right keeps the start, left the end, middle
    both ends."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(MARK))
    if side == "right":
        return text[:keep] + MARK
    if side == "left":
        return MARK + text[len(text) - keep :]
    head = keep - keep // 2
    return text[:head] + MARK + text[len(text) - keep // 2 :]
