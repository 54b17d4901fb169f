"""verl's in-trainer rollout handle for ``rollout.name=agentloop`` in hybrid mode (verl's default: trainer and
rollout share the GPUs and take turns).

verl builds one in every trainer worker and, with the ``naive`` checkpoint backend, drives a weight sync through
it: ``resume(["weights"])``, ``update_weights(per-tensor params)``, ``resume(["kv_cache"])``; ``release()`` frees
the rollout's memory. Here the first rank of each replica's workers holds its server (the replica's named actor
tells the address) and does each step over EngineControl: WakeUp with those tags (and FlushCache once the KV cache
is back), the weights by our transfer (``weight_push.py``), Sleep(KV_CACHE_AND_WEIGHTS). The other ranks walk
verl's generator (their gathers are collective) and return.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from agentloop_grpc.common.types import Resource
from agentloop_grpc.router import Fleet

from .server_actor import sleep_when_idle
from .settings import settings_from
from .weight_push import WeightPusher, drain

_TAGS = {"weights": Resource.WEIGHTS, "kv_cache": Resource.KV_CACHE}


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    """The named Ray actor of replica ``replica_rank``'s server (``replica.py`` creates it)."""
    return f"agentloop_server_{replica_rank}{name_suffix}"


class AgentloopRolloutAdapter(BaseRollout):
    """See the module docstring."""

    def __init__(self, config, model_config, device_mesh, *args, replica_rank: int = -1, **kwargs) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader_rank = rank % world == 0
        settings = settings_from(self.config)
        self._pusher = WeightPusher(settings) if self.is_leader_rank else None
        self._address: str | None = None
        self._fleet: Fleet | None = None

    async def _server(self) -> tuple[str, Fleet]:
        if self._fleet is None:
            actor = ray.get_actor(server_actor_name(self.replica_rank))
            self._address = await actor.address.remote()
            self._fleet = await Fleet([self._address]).__aenter__()
        return self._address, self._fleet

    async def resume(self, tags: list[str]) -> None:
        if not self.is_leader_rank:
            return
        unknown = sorted(set(tags) - set(_TAGS))
        if unknown:
            raise ValueError(f"resume tags {unknown}: agentloop servers restore {sorted(_TAGS)}")
        _address, fleet = await self._server()
        (await fleet.wake_up([_TAGS[tag] for tag in tags])).raise_for_errors()
        if "kv_cache" in tags:  # the cache was computed with the weights before the update
            (await fleet.flush_cache()).raise_for_errors()

    async def release(self) -> None:
        if self.is_leader_rank:
            _address, fleet = await self._server()
            await sleep_when_idle(fleet, 2)

    async def update_weights(self, weights, wire_format: str = "named_tensors", peft_config: Any = None,
                             global_steps: int | None = None, **kwargs: Any) -> dict[str, Any]:
        if wire_format != "named_tensors":
            raise ValueError(f"wire_format {wire_format!r}: agentloop servers take full tensors (named_tensors)")
        if peft_config is not None:
            raise ValueError("LoRA adapters are not carried to agentloop servers: set actor_rollout_ref.model.lora"
                             ".merge=True so verl sends merged weights")
        if self._pusher is None:
            await drain(weights)
            return {}
        address, _fleet = await self._server()
        return await self._pusher.push([address], weights, global_steps)
