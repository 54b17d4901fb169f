"""verl's rollout replica on agentloop.v1 engines: ``actor_rollout_ref.rollout.name=agentloop``.

A verl replica is one engine instance (its TP ranks); here it is one engine server (one DP group, as
``agentloop engine launch`` starts them) behind an ``EngineServerActor`` that verl's balancer, client and
checkpoint manager call (``server_actor.py``). Where it runs:
  - hybrid (verl's trainer workers hold the GPUs): the server starts on the node of the replica's first worker,
    on those workers' GPUs (``CUDA_VISIBLE_DEVICES``), and sleeps while the trainer trains;
  - standalone: the server starts wherever Ray has room for it. verl's GPU pool and checkpoint-engine workers
    are not created: our servers hold their own devices and receive weights over gRPC or their weight group
    (``checkpoint_engine.py``);
  - ``custom.agentloop.servers`` lists servers already running: replica ``i`` attaches to the ``i``-th.
Colocated mode (verl's reward and teacher models) is refused: those are verl's own engines.
"""

from __future__ import annotations

from typing import Any

import ray
from omegaconf import OmegaConf
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from agentloop_grpc.launch.launcher import EngineLaunch

from .rollout_adapter import server_actor_name
from .server_actor import EngineServerActor
from .settings import AgentloopSettings, settings_from

#: Engines that need the replica's GPUs; the others (embedded, fake) run on CPUs.
_GPU_ENGINES = frozenset({"vllm", "sglang"})


class AgentloopReplica(RolloutReplica):
    """One engine server per replica; see the module docstring."""

    async def init_standalone(self) -> None:
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def init_colocated(self, resource_pool) -> None:
        raise NotImplementedError("rollout name 'agentloop' runs the policy's rollout (hybrid or standalone); "
                                  "colocated reward or teacher models need verl's own rollout names")

    def _launch(self, settings: AgentloopSettings) -> EngineLaunch:
        fields = dict(settings.engine_config)
        model_path = self.model_config.get("local_path") or self.model_config.get("path")
        if settings.engine != "fake" and "model" not in fields and model_path:
            fields["model"] = str(model_path)
        tp = self.config.tensor_model_parallel_size
        if settings.engine == "sglang":
            fields.setdefault("tp_size", tp)
        elif settings.engine == "vllm" and tp != 1:
            raise ValueError(f"the vllm adapter serves tensor_model_parallel_size=1, not {tp}")
        return EngineLaunch.of(settings.engine, fields, startup_timeout_s=settings.startup_timeout_s)

    async def launch_servers(self) -> None:
        settings = settings_from(self.config)
        if self.config.data_parallel_size != 1 or self.config.pipeline_model_parallel_size != 1:
            raise ValueError("rollout name 'agentloop' serves one DP group per replica: set data_parallel_size=1 "
                             "and pipeline_model_parallel_size=1 (more replicas give more DP groups)")
        options: dict[str, Any] = {"name": server_actor_name(self.replica_rank, self.name_suffix), "num_cpus": 1,
                                   "max_concurrency": self.max_concurrency}
        env: dict[str, str] = {}
        if self.workers:  # hybrid: on the node and GPUs of the replica's trainer workers
            node_id, devices = await self.workers[0].__ray_call__.remote(_node_and_devices)
            others = [
                await w.__ray_call__.remote(_node_and_devices) for w in self.workers[1:self.gpus_per_replica_node]
            ]
            devices = ",".join([devices, *(d for _node, d in others)])
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            env["CUDA_VISIBLE_DEVICES"] = devices
        elif settings.engine in _GPU_ENGINES and not settings.servers:
            options["num_gpus"] = self.gpus_per_replica_node
        if settings.servers:
            if self.replica_rank >= len(settings.servers):
                raise ValueError(f"replica {self.replica_rank} has no server: custom.agentloop.servers lists "
                                 f"{len(settings.servers)}")
            target = {"address": settings.servers[self.replica_rank]}
        else:
            target = {"launch": self._launch(settings)}
        # what the actor's client reads of verl's config: the rollout's lengths and sampling defaults, and the model
        # (its processor finds the spans of verl's pictures in the prompt ids)
        read = ("prompt_length", "response_length", "repetition_penalty", "ignore_eos", "full_determinism", "seed")
        model_path = self.model_config.get("local_path") or self.model_config.get("path")
        trainer_config = OmegaConf.create({"actor_rollout_ref": {
            "rollout": {name: getattr(self.config, name) for name in read},
            "model": {"path": str(model_path) if model_path else None},
        }})
        actor = ray.remote(EngineServerActor).options(**options).remote(
            trainer_config, self.rollout_mode.value, self.config.free_cache_engine,
            startup_timeout_s=settings.startup_timeout_s, env=env, **target,
        )
        self._server_address = await actor.start.remote()
        self._server_handle = actor
        self.servers = [actor]

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop the launched server and its actor (verl's replicas have no stop: their actors die with Ray)."""
        for server in self.servers:
            await server.stop.remote(grace_s)
            ray.kill(server)
        self.servers = []


def _node_and_devices(worker) -> tuple[str, str]:
    """Runs inside a verl worker: its node and the accelerator it was given."""
    context = ray.get_runtime_context()
    accelerators = context.get_accelerator_ids()
    ids = accelerators.get("GPU") or accelerators.get("NPU") or [""]
    return context.get_node_id(), str(ids[0])
