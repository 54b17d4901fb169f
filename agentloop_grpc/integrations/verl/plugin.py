"""Makes ``rollout.name=agentloop`` known to verl: verl imports this module at ``import verl`` (our
``verl.plugins`` entry point in pyproject.toml), so no verl file is patched and no user code runs first.

verl's plugin contract is a module imported for its side effect. Two names are registered: the replica (a loader
in verl's replica registry: Ray and our launcher are imported only when verl asks for it) and, for hybrid mode,
the in-trainer rollout handle (an import path in verl's rollout table, which has no registration function).
"""

from __future__ import annotations

from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplicaRegistry

#: Our rollout's name in verl's config (``actor_rollout_ref.rollout.name``).
ROLLOUT_NAME = "agentloop"


def _load_replica():
    from .replica import AgentloopReplica

    return AgentloopReplica


RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (
    "agentloop_grpc.integrations.verl.rollout_adapter.AgentloopRolloutAdapter"
)
