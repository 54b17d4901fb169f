"""Finding this server's TP group: every rank's named actor, each confirming who it is.

start() waits up to ``discovery_timeout_s`` for all ``tp_size`` actors to be registered (they may still be
starting), then asks each for its identity: an actor registered under a rank's name but configured for another
group, rank or TP size is a deployment error, said plainly. A name for rank ``tp_size`` existing means the group
is larger than this server was told, also an error (serving half a group would hang SGLang's collectives).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ray

from agentloop_grpc.common.errors import EngineUnavailableError

from .config import SglangEngineConfig

_RETRY_S = 0.1


class TpGroupError(EngineUnavailableError):
    """The TP group is missing, incomplete or misconfigured."""


@dataclass(frozen=True, slots=True)
class TpGroup:
    """A discovered TP group: handles in rank order (``leader`` is rank 0)."""

    names: tuple[str, ...]
    actors: tuple[ray.actor.ActorHandle, ...]

    @property
    def leader(self) -> ray.actor.ActorHandle:
        return self.actors[0]


def _lookup(name: str, namespace: str) -> ray.actor.ActorHandle | None:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:  # Ray: "Failed to look up actor with name ..."
        return None


async def find_tp_group(config: SglangEngineConfig) -> TpGroup:
    naming = config.naming
    names = tuple(naming.name(config.dp_rank, r) for r in range(config.tp_size))
    deadline = time.monotonic() + config.discovery_timeout_s
    while True:
        found = [await asyncio.to_thread(_lookup, name, naming.namespace) for name in names]
        missing = [name for name, handle in zip(names, found) if handle is None]
        if not missing:
            break
        if time.monotonic() >= deadline:
            what = "missing" if len(missing) == len(names) else "incomplete"
            raise TpGroupError(
                f"TP group of DP rank {config.dp_rank} is {what} in Ray namespace {naming.namespace!r} after "
                f"{config.discovery_timeout_s:.0f} s: missing {missing}, expected {list(names)}"
            )
        await asyncio.sleep(_RETRY_S)
    extra = naming.name(config.dp_rank, config.tp_size)
    if await asyncio.to_thread(_lookup, extra, naming.namespace) is not None:
        raise TpGroupError(f"actor {extra!r} exists: the TP group is larger than tp_size = {config.tp_size}")
    identities = await asyncio.gather(*(handle.identity.remote() for handle in found))
    for tp_rank, (name, identity) in enumerate(zip(names, identities)):
        if identity != config.rank(tp_rank):
            raise TpGroupError(
                f"actor {name!r} reports {identity}, expected TP rank {tp_rank} of {config.tp_size} in DP rank "
                f"{config.dp_rank} (prefix {naming.prefix!r})"
            )
    return TpGroup(names=names, actors=tuple(found))
