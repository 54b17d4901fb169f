"""Makes ``rollout.name=agentloop`` known to verl: verl imports this module at ``import verl`` (our
``verl.plugins`` entry point in pyproject.toml), so no verl file is patched and no user code runs first.

verl's plugin contract is a module imported for its side effect; the one thing done here is registering a loader
in verl's replica registry, and the replica (Ray, our launcher) is imported only when verl asks for it.
"""

from __future__ import annotations

from verl.workers.rollout.replica import RolloutReplicaRegistry

#: Our rollout's name in verl's config (``actor_rollout_ref.rollout.name``).
ROLLOUT_NAME = "agentloop"


def _load_replica():
    from .replica import AgentloopReplica

    return AgentloopReplica


RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
