"""verl's checkpoint-engine backend ``agentloop``: the trainer side of verl's weight sync, applied on our engine
servers by our weight transfer (collective broadcast, checkpoint path or gRPC stream; ``weight_push.py``).

verl imports this module on every worker before it builds the backend (``checkpoint_engine.custom_backend_module``,
verl's own key); importing it registers the backend under that name, which is how verl's registry is extended.
The servers receive the bytes themselves over agentloop.v1, so verl's rollout-side steps (its checkpoint-engine
workers, ``receive_weights``) have nothing to do: ``checkpoint_manager.AgentloopCheckpointManager`` drives the
update and tells rank 0 where the servers are (``init_process_group(servers=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from .settings import AgentloopSettings
from .weight_push import WeightPusher, drain

#: The backend's name in verl's config (``checkpoint_engine.backend``).
BACKEND = "agentloop"


@CheckpointEngineRegistry.register(BACKEND)
class AgentloopCheckpointEngine(CheckpointEngine):
    """verl builds one per trainer rank: ``(bucket_size, is_master, **engine_kwargs[agentloop])``; the engine
    kwargs are our settings' weight-transfer keys (``weight_transfer``, ``weights_dir``, ``weight_group_address``,
    ``weight_group_backend``) and, for servers verl did not launch, ``servers``."""

    def __init__(self, bucket_size: int, is_master: bool = False, servers: Sequence[str] = (), **transfer: Any):
        self.is_master = is_master
        self.servers = list(servers)
        self._pusher = WeightPusher(AgentloopSettings(servers=tuple(servers), **transfer)) if is_master else None

    def prepare(self) -> dict[str, Any]:
        """Nothing to allocate: the transfer holds its buffers."""
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """No group spans verl's workers: our servers form their own with the pushing rank."""
        return {}, {}

    def init_process_group(self, servers: Sequence[str] = ()) -> None:
        """Where the servers are (the manager's call, with its replicas' addresses)."""
        if servers:
            self.servers = list(servers)

    def finalize(self) -> None:
        """The weight group stays formed for the next update."""

    async def send_weights(self, weights, global_steps: int | None = None) -> dict[str, Any]:
        if self._pusher is None:
            await drain(weights)
            return {}
        if not self.servers:
            raise ValueError("checkpoint engine 'agentloop' knows no servers: set "
                             "actor_rollout_ref.rollout.checkpoint_manager_class to "
                             "agentloop_grpc.integrations.verl.checkpoint_manager.AgentloopCheckpointManager, or "
                             "checkpoint_engine.engine_kwargs.agentloop.servers")
        return await self._pusher.push(self.servers, weights, global_steps)

    async def receive_weights(self, global_steps: int | None = None):
        raise NotImplementedError("agentloop servers receive weights over agentloop.v1, not in verl's workers")
