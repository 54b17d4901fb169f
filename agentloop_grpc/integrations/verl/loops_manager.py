"""verl's ``AgentLoopManager`` with our Router under verl's own loops: the same workers (Ray actors of verl's
``AgentLoopWorker``) run the same loops (single-turn, tool, any registered one), but the client they are handed
is ``AgentloopLLMClient`` over the engine servers' gRPC addresses, so a verl run gets our routing, sticky
sessions, failover with resume and engine-side aborts without changing a loop.

```yaml
actor_rollout_ref:
  rollout:
    agent:
      agent_loop_manager_class: agentloop_grpc.integrations.verl.loops_manager.RouterAgentLoopManager
    custom:
      agentloop:
        servers: ["10.0.0.1:50051", "10.0.0.2:50051"]   # else the servers of verl's rollout (name=agentloop)
```

verl's trainer creates the manager with the client of its own server manager; that client's only use here is to find
the servers (``settings.server_addresses``). Its workers are ``RouterAgentLoopWorker``: verl's worker, each sample's
loop run with the sample's ``uid`` as its GRPO group for the Router (``sample_group.py``). A
``FullyAsyncLLMServerClient`` (partial rollout) becomes our fully-async client, so aborted generations still resume
invisibly to the loops.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from .client import AgentloopFullyAsyncLLMClient, AgentloopLLMClient
from .sample_group import sample_group
from .settings import server_addresses


async def agentloop_client(config: Any, llm_client: LLMServerClient) -> AgentloopLLMClient:
    """Ours in place of verl's ``llm_client``: over the servers it reaches, with its resume semantics."""
    if isinstance(llm_client, AgentloopLLMClient):
        return llm_client
    servers = await server_addresses(config, llm_client)
    if isinstance(llm_client, FullyAsyncLLMServerClient):
        return AgentloopFullyAsyncLLMClient(config, only_hybrid=llm_client._only_hybrid, servers=servers)
    return AgentloopLLMClient(config, servers=servers)


class RouterAgentLoopWorker(AgentLoopWorker):
    """verl's worker, each sample's loop run with its ``uid`` as the GRPO group of the calls it makes (verl runs each
    sample in a task of its own, so the group set here is that sample's alone)."""

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name: str, trace: bool = True, **kwargs):
        with sample_group(kwargs.get("uid")):
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **kwargs)


class RouterAgentLoopManager(AgentLoopManager):
    """verl's manager, its workers (``RouterAgentLoopWorker``) handed ``AgentloopLLMClient`` (see the module
    docstring; ``manager.py``'s ``AgentloopAgentLoopManager`` runs our own loops instead). Created as verl's:
    ``RouterAgentLoopManager.create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)``."""

    agent_loop_workers_class = ray.remote(RouterAgentLoopWorker)

    async def _init_agent_loop_workers(self) -> None:
        # the swap happens here, not in __init__: finding verl's servers asks its load balancer, a Ray call
        self.llm_client = await agentloop_client(self.config, self.llm_client)
        await super()._init_agent_loop_workers()


__all__ = ["RouterAgentLoopManager", "RouterAgentLoopWorker", "agentloop_client"]
