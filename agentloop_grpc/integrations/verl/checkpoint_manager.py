"""verl's checkpoint manager for rollout name ``agentloop`` (``actor_rollout_ref.rollout.checkpoint_manager_class``).

verl's own manager aborts every replica, builds a process group with each replica's checkpoint-engine workers and
resumes; ours has the trainer ranks push to the replicas' servers and nothing else: the servers swap weights
between two decode steps and stamp each token with the version that produced it, so generations in flight
need no abort. Replicas asleep (hybrid, between rollouts) are woken first: released weights cannot be updated.
Other backends go to verl's own manager unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.utils.ray_utils import auto_await

from .checkpoint_engine import BACKEND


class AgentloopCheckpointManager(CheckpointEngineManager):
    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        if self.backend != BACKEND:
            return await super().update_weights(global_steps)
        await self.wake_up_replicas()
        servers = [replica.server_address for replica in self.replicas]
        ranks = self.actor_wg.world_size
        await _gather(
            self.actor_wg.execute_checkpoint_engine(["init_process_group"] * ranks, servers=[servers] * ranks)
        )
        results = await _gather(self.actor_wg.update_weights(global_steps=global_steps, mode=BACKEND))
        metrics: dict[str, Any] = {}
        for result in results:
            if isinstance(result, dict):
                metrics.update(result)
        return metrics


async def _gather(refs) -> list:
    """verl's non-blocking worker-group calls answer one object ref per rank."""
    return list(await asyncio.gather(*refs))
