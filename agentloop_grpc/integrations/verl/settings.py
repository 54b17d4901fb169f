"""Our section of verl's config: ``actor_rollout_ref.rollout.custom.agentloop`` (verl's own extension point, so
nothing of verl's schema is patched), and where the engine servers of a verl run are.

```yaml
actor_rollout_ref:
  rollout:
    name: agentloop            # our rollout replica (registered by the verl.plugins entry point)
    custom:
      agentloop:
        engine: embedded       # the adapter each launched server runs (embedded, vllm, sglang)
        engine_config: {max_running: 64}
        servers: []            # or the addresses of engine servers already running: nothing is launched
        weight_transfer: auto  # collective, path or stream (checkpoint_engine.py, rollout_adapter.py)
        loops: {}              # the loop-level manager's settings (integrations.verl.manager)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field

from agentloop_grpc.agent.weight_transfer import WeightTransferKind

#: The key under ``rollout.custom`` that holds our settings.
SECTION = "agentloop"


class AgentloopSettings(BaseModel):
    """``rollout.custom.agentloop``; unknown keys are refused by name (a typo must not launch the default engine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str = "embedded"
    """The adapter every launched server runs (``agentloop engine serve --adapter``)."""
    engine_config: dict[str, Any] = Field(default_factory=dict)
    """The adapter's config (its ``EngineConfig`` fields); the model comes from verl's ``model.path`` unless set."""
    servers: tuple[str, ...] = ()
    """Addresses of engine servers that already run (``agentloop engine launch``): the replica launches nothing."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """How long a launched server may take to load its model and report SERVING."""
    weight_transfer: WeightTransferKind = "auto"
    """How verl's weights reach the servers (``agent/weight_transfer.py``): ``auto`` broadcasts over a weight
    group when the servers can join one, else has them load a checkpoint file when they share this machine (or
    ``weights_dir``), else streams it over gRPC."""
    weights_dir: str | None = None
    """A folder every server can read (shared storage): ``path`` transfers write there."""
    weight_group_address: str | None = None
    """The address the servers reach the trainer's weight group by; None: this machine's address towards them."""
    weight_group_backend: Literal["gloo", "nccl"] = "gloo"
    """gloo moves CPU bytes (any machine); nccl needs GPUs on both ends."""
    loops: dict[str, Any] = Field(default_factory=dict)
    """The loop-level agent-loop manager's settings; read by ``integrations.verl.manager``."""


def settings_from(rollout_config: Any) -> AgentloopSettings:
    """The settings in a verl rollout config (a DictConfig or verl's ``RolloutConfig``); defaults when absent."""
    custom = rollout_config.get("custom") if isinstance(rollout_config, Mapping) else rollout_config.custom
    section = (custom or {}).get(SECTION) or {}
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    return AgentloopSettings.model_validate(section)


async def server_addresses(config: Any, llm_client: Any) -> list[str]:
    """The engine servers of a verl run: those named in our settings, else every server verl's load balancer holds
    (our replicas register their gRPC address as verl's server id)."""
    settings = settings_from(config.actor_rollout_ref.rollout)
    if settings.servers:
        return list(settings.servers)
    balancer = llm_client._load_balancer  # verl's client keeps no public handle on its balancer
    if balancer is None:
        raise ValueError("no engine servers: set actor_rollout_ref.rollout.custom.agentloop.servers or run verl's "
                         "rollout with name=agentloop")
    return list(await balancer.get_all_servers.remote())


__all__ = ["SECTION", "AgentloopSettings", "server_addresses", "settings_from"]
