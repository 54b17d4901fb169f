"""Before a rollout that records routed experts (``AgentLoopConfig.return_routed_experts``): every engine must
report them, else the rollout is refused at once instead of failing every trajectory's first generation."""

from __future__ import annotations

from collections.abc import Mapping

from agentloop_grpc.router import ServerInfo


class RoutingUnavailableError(ValueError):
    """The loops ask for routed experts and an engine server cannot report them."""


def check_engine_routing(infos: Mapping[str, ServerInfo]) -> None:
    """Raise RoutingUnavailableError naming the servers whose GetServerInfo reports no routed expert layers."""
    unable = sorted(address for address, info in infos.items() if info.routed_expert_layers <= 0)
    if unable:
        raise RoutingUnavailableError(
            f"return_routed_experts is set but {', '.join(unable)} cannot report routed experts (GetServerInfo "
            "routed_expert_layers is 0: a dense model, or an engine that does not map them; docs/contract.md)")
