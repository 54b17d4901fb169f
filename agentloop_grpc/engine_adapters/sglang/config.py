"""Configuration of the SGLang adapter: which Ray actors form this server's TP group, and how they are named.

One gRPC server serves one data-parallel group. Its TP group is ``tp_size`` named Ray actors in one Ray namespace,
one per TP rank; the name of each comes from ``ActorNaming.template`` (by default
``{prefix}-dp{dp_rank}-tp{tp_rank}``), so whoever deploys the actors and whoever serves them agree on names
without a registry. Every call goes to the TP-rank-0 actor, which holds ``sgl.Engine``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

DEFAULT_TEMPLATE = "{prefix}-dp{dp_rank}-tp{tp_rank}"
DEFAULT_NAMESPACE = "agentloop"
_FIELDS = {"prefix", "dp_rank", "tp_rank"}


@dataclass(frozen=True, slots=True)
class ActorNaming:
    """How the actors of every TP group are named: ``template`` filled with prefix, DP rank and TP rank."""

    #: The deployment's group prefix (one per model replica set, e.g. ``"policy"``).
    prefix: str
    #: The Ray namespace the actors are registered in (named actors are only visible within their namespace).
    namespace: str = DEFAULT_NAMESPACE
    #: A ``str.format`` template over ``prefix``, ``dp_rank`` and ``tp_rank``; it must use all three, or two ranks
    #: would share a name.
    template: str = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        if not self.prefix or not self.namespace:
            raise ValueError("ActorNaming needs a non-empty prefix and namespace")
        used = {name for _, name, _, _ in string.Formatter().parse(self.template) if name}
        if used != _FIELDS:
            raise ValueError(
                f"ActorNaming.template must use exactly {{prefix}}, {{dp_rank}} and {{tp_rank}}; got {self.template!r}"
            )

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


@dataclass(frozen=True, slots=True)
class SglangEngineConfig:
    """One SGLang gRPC server: its DP group and where to find that group's TP actors."""

    naming: ActorNaming
    dp_rank: int = 0
    dp_size: int = 1
    tp_size: int = 1
    #: Reported as ServerInfo.model_id; empty: the engine's ``model_path``.
    model_id: str = ""
    #: How long start() waits for every TP actor of the group to be registered (actors may still be starting).
    discovery_timeout_s: float = 60.0
    #: Seconds between polls of SGLang's load (KV usage, cache hit rate) for GetLoad, which must answer at once.
    load_poll_s: float = 1.0
    #: Ray cluster address for ``ray.init`` when this process is not connected yet (None: ``"auto"``).
    ray_address: str | None = field(default=None)

    def __post_init__(self) -> None:
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError("dp_rank must be in [0, dp_size)")
        if self.tp_size < 1:
            raise ValueError("tp_size must be >= 1")
        if self.discovery_timeout_s < 0 or self.load_poll_s <= 0:
            raise ValueError("discovery_timeout_s must be >= 0 and load_poll_s > 0")

    def rank(self, tp_rank: int) -> TpRank:
        return TpRank(self.naming, self.dp_rank, tp_rank, self.tp_size)
