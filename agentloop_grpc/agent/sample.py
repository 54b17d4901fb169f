"""Sample: one prompt to roll out, as a dataset row describes it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .config import SamplingConfig


class Sample(BaseModel):
    """A conversation to continue, what it needs (tools, interaction) and what it is scored against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_id: str = Field(min_length=1, description="Unique in the batch; the router's session id.")
    messages: tuple[dict[str, Any], ...] = Field(min_length=1, description="Chat messages (role, content).")
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
            if not isinstance(message.get("content", ""), str):
                raise ValueError(f"messages[{i}].content must be a string")
        return messages
