"""Deploying one DP group's TP actors under the names the adapter looks for.

``deploy_tp_group`` creates ``tp_size`` named ``SglangEngineActor``s; rank 0 gets the engine kwargs. Resources
and placement are the caller's (``actor_options(tp_rank)``: e.g. ``num_gpus`` and a placement-group strategy),
because they depend on the cluster: on one node, rank 0's ``sgl.Engine`` starts a scheduler per TP rank itself
and needs to see every GPU of the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from .actor import SglangEngineActor
from .api import SglangApi
from .config import ActorNaming, TpRank


def deploy_tp_group(
    naming: ActorNaming,
    dp_rank: int,
    tp_size: int,
    engine_kwargs: dict[str, Any],
    api: SglangApi | None = None,
    actor_options: Callable[[int], dict[str, Any]] | None = None,
    actor_class: type[SglangEngineActor] = SglangEngineActor,
) -> list[ray.actor.ActorHandle]:
    """Create the named actors of one TP group (rank order); they live until killed or their owner exits."""
    handles = []
    for tp_rank in range(tp_size):
        rank = TpRank(naming, dp_rank, tp_rank, tp_size)
        options = {"name": rank.name, "namespace": naming.namespace, "num_cpus": 0}
        options.update(actor_options(tp_rank) if actor_options else {})
        remote = ray.remote(actor_class).options(**options)
        handles.append(remote.remote(rank, engine_kwargs if tp_rank == 0 else None, api))
    return handles
