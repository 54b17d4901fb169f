"""Sample: one prompt to roll out, as a dataset row describes it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .config import SamplingConfig


class Sample(BaseModel):
    """A conversation to continue, what it needs (tools, interaction) and what it is scored against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_id: str = Field(min_length=1, description="Unique in the batch; the router's session id.")
    messages: tuple[dict[str, Any], ...] = Field(
        min_length=1, description="Chat messages (role, content); content is a string or a list of text and image "
        "parts (agent/images.py)."
    )
    loop: str = Field("tool", description="Name of the loop in the LoopRegistry that runs this sample.")
    tools: tuple[str, ...] | None = Field(None, description="The tools this sample may use (None: every tool).")
    tools_kwargs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="CreateInstance arguments per tool name (e.g. a checker's ground truth)."
    )
    ground_truth: str | None = Field(None, description="What the reward function compares with.")
    interaction: str | None = Field(None, description="Name of the interaction (user simulator) to use, if any.")
    interaction_kwargs: dict[str, Any] = Field(default_factory=dict)
    group_id: str = Field("", description="Samples of one prompt share it (GRPO groups).")
    sampling: SamplingConfig | None = Field(
        None, description="This sample's sampling for every turn, over the loop config's sampling and turn_sampling "
        "(e.g. greedy, temperature 0, or verl's val_kwargs for a validation batch); None: the loop config's."
    )

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for i, message in enumerate(messages):
            if message.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"messages[{i}].role must be system, user, assistant or tool")
            content = message.get("content", "")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    _check_part(part, f"messages[{i}].content[{j}]")
            elif not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string or a list of text and image parts")
        return messages


def _check_part(part: Any, where: str) -> None:
    """A content part's shape (the picture itself is read and checked by the loop, so a bad one fails only its
    sample); Parquet rows give every part every key, None where unused."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and not isinstance(part.get("text"), str):
        raise ValueError(f"{where}.text must be a string")
    if kind == "image" and part.get("image") is None:
        raise ValueError(f"{where}.image must name the picture (a file path, a data URL or bytes)")
    if kind not in ("text", "image"):
        raise ValueError(f"{where} must be a {{'type': 'text', 'text': ...}} or {{'type': 'image', 'image': ...}} part")
