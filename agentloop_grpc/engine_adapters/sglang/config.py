"""Configuration of the SGLang adapter: which Ray actors form this server's TP group, and how they are named.

One gRPC server serves one data-parallel group. Its TP group is ``tp_size`` named Ray actors in one Ray namespace,
one per TP rank; the name of each comes from ``ActorNaming.template`` (by default
``{prefix}-dp{dp_rank}-tp{tp_rank}``), so whoever deploys the actors and whoever serves them agree on names
without a registry. Every call goes to the TP-rank-0 actor, which holds ``sgl.Engine``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config_base import EnginePlacement

DEFAULT_TEMPLATE = "{prefix}-dp{dp_rank}-tp{tp_rank}"
DEFAULT_NAMESPACE = "agentloop"
_FIELDS = {"prefix", "dp_rank", "tp_rank"}


class ActorNaming(BaseModel):
    """How the actors of every TP group are named: ``template`` filled with prefix, DP rank and TP rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str = Field(
        min_length=1, description="The deployment's group prefix (one per model replica set, e.g. policy)."
    )
    namespace: str = Field(
        DEFAULT_NAMESPACE, min_length=1,
        description="The Ray namespace the actors are registered in (named actors are only visible within it).",
    )
    template: str = Field(
        DEFAULT_TEMPLATE, description="A str.format template over prefix, dp_rank and tp_rank; it must use all "
        "three, or two ranks would share a name."
    )

    @field_validator("template")
    @classmethod
    def _uses_every_rank(cls, template: str) -> str:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        if used != _FIELDS:
            raise ValueError(
                f"ActorNaming.template must use exactly {{prefix}}, {{dp_rank}} and {{tp_rank}}; got {template!r}"
            )
        return template

    def name(self, dp_rank: int, tp_rank: int) -> str:
        return self.template.format(prefix=self.prefix, dp_rank=dp_rank, tp_rank=tp_rank)


@dataclass(frozen=True, slots=True)
class TpRank:
    """Who one actor is: the identity it reports, checked by the adapter at discovery."""

    naming: ActorNaming
    dp_rank: int
    tp_rank: int
    tp_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size or self.dp_rank < 0:
            raise ValueError(
                f"need 0 <= tp_rank < tp_size and dp_rank >= 0 (got {self.tp_rank}, {self.tp_size}, {self.dp_rank})"
            )

    @property
    def name(self) -> str:
        return self.naming.name(self.dp_rank, self.tp_rank)


class SglangEngineConfig(EnginePlacement):
    """One SGLang gRPC server: its DP group and where to find that group's TP actors. It takes no request limits:
    max_model_len and batch capacity are SGLang's own settings, given when its actors are deployed."""

    kind: Literal["sglang"] = Field("sglang", description="The TP-rank-0 Ray actor holding sgl.Engine.")
    naming: ActorNaming = Field(
        default_factory=lambda: ActorNaming(prefix="sglang"), description="How the TP actors are named."
    )
    tp_size: int = Field(1, ge=1, description="Tensor-parallel size (number of TP actors in this DP group).")
    model_id: str = Field("", description="Reported as GetServerInfo.model_id; empty: the engine's model_path.")
    discovery_timeout_s: float = Field(
        60.0, ge=0, description="How long start() waits for every TP actor of the group to be registered (actors "
        "may still be starting)."
    )
    load_poll_s: float = Field(
        1.0, gt=0, description="Seconds between polls of SGLang's load (KV usage, cache hit rate) for GetLoad, "
        "which must answer at once."
    )
    ray_address: str | None = Field(
        None, description="Ray cluster address for ray.init when this process is not connected yet (None: auto)."
    )
    max_images_per_request: int = Field(
        4, ge=0, description="Images one prompt may show, for a vision-language model (GetServerInfo reports it and "
        "the server refuses more; SGLang sets no such limit of its own); 0 takes no images."
    )

    def rank(self, tp_rank: int) -> TpRank:
        return TpRank(self.naming, self.dp_rank, tp_rank, self.tp_size)
