"""A dataset row as a Sample: what every player (our loops, an agent of your own) and every trainer integration
(TRL, verl, ``agentloop rollout``) plays, read one way.

A row has ``messages`` and optionally ``ground_truth``, ``tools``, ``tools_kwargs``, ``loop``, ``interaction`` and
``sampling``; an image part's relative path is relative to the dataset file (``base_dir``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .sample import Sample


def row_sample(row: Mapping[str, Any], sample_id: str, group_id: str, default_loop: str = "tool",
               ground_truth_kwargs: Sequence[str] = ("check_answer",), base_dir: Path | None = None) -> Sample:
    """The Sample of one dataset row: ``ground_truth_kwargs`` tools get ``{"ground_truth": ...}`` at
    CreateInstance; relative image paths are relative to ``base_dir`` (None: the working directory). KeyError,
    TypeError or ValidationError on a malformed row."""
    truth = row.get("ground_truth")
    kwargs = {name: dict(value) for name, value in (row.get("tools_kwargs") or {}).items()}
    if truth is not None:
        for tool in ground_truth_kwargs:
            kwargs.setdefault(tool, {}).setdefault("ground_truth", str(truth))
    return Sample(
        sample_id=sample_id,
        group_id=group_id,
        messages=tuple(row["messages"]) if base_dir is None else _with_image_paths(row["messages"], base_dir),
        loop=row.get("loop") or default_loop,
        tools=tuple(row["tools"]) if row.get("tools") is not None else None,
        tools_kwargs=kwargs,
        ground_truth=None if truth is None else str(truth),
        interaction=row.get("interaction"),
        sampling=row.get("sampling"),
    )


def _with_image_paths(messages: Sequence[dict[str, Any]], base_dir: Path) -> tuple[dict[str, Any], ...]:
    """``messages`` with relative image paths made relative to ``base_dir``."""
    def part(p: Any) -> Any:
        image = p.get("image") if isinstance(p, dict) and p.get("type") == "image" else None
        if isinstance(image, str) and not image.startswith("data:") and not Path(image).is_absolute():
            return {**p, "image": str(base_dir / image)}
        return p

    return tuple({**m, "content": [part(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
                 for m in messages)
