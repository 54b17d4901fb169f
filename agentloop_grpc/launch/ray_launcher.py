"""RayEngineLauncher: the engine servers of a Ray cluster, one per DP group, each in its own placement group.

``EngineLauncher`` starts servers on the node it runs on. On a Ray cluster, ``agentloop engine launch --ray`` runs
once, anywhere with access to the cluster, instead:
  - every DP group gets a placement group of one bundle holding the group's CPUs and GPUs; a bundle is never split
    over nodes, so a TP group lands on one node, and Ray places each group's bundle wherever its resources are free,
    so the groups spread over the cluster's nodes;
  - a small host actor scheduled into that bundle (so it holds the reservation, and Ray sets CUDA_VISIBLE_DEVICES to
    the bundle's GPUs) starts ``agentloop engine serve`` on its node, bound to the node's IP, waits until it is
    SERVING, and returns its address;
  - the discovery file lists every server with its node and placement group.
Stopping drains the servers (SIGTERM), kills the host actors and removes the placement groups. A host actor that
dies (node drained, ``ray.kill``) takes its server with it (``ServerProcess.terminate_with_parent``). Log files are
written on each server's node.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig

from .launcher import EngineLaunch, Launcher, LaunchError, ServerProcess, write_discovery

log = logging.getLogger(__name__)

_REMOVE_TIMEOUT_S = 10.0



@dataclass(frozen=True)
class RayResources:
    """What each DP group reserves in its placement group."""

    cpus_per_server: float = 1.0
    #: GPUs of the whole DP group (its TP ranks), on one node.
    gpus_per_server: float = 0.0
    #: How long to wait for the cluster to have room for every group.
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.cpus_per_server <= 0 or self.gpus_per_server < 0:
            raise ValueError("cpus_per_server must be > 0 and gpus_per_server >= 0")

    @property
    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_server, **({"GPU": self.gpus_per_server} if self.gpus_per_server else {})}


class ServerHost:
    """Ray actor: starts and stops one engine server process on the node Ray placed it on."""

    def __init__(self, launch: EngineLaunch, rank: int, log_dir: str) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        command = dataclasses.replace(launch, host=self.node_ip).command(rank)
        self.server = ServerProcess(command, Path(log_dir) / f"engine-{rank}.log", terminate_with_parent=True,
                                    security=launch.client_security)

    async def start(self, timeout_s: float) -> dict[str, str]:
        address = await self.server.start(timeout_s)
        return {"address": address, "node_ip": self.node_ip, "node_id": self.node_id}

    async def stop(self, grace_s: float) -> int | None:
        return await self.server.stop(grace_s)

    def server_pid(self) -> int | None:
        return self.server.process.pid if self.server.process else None


class RayEngineLauncher(Launcher):
    """Start ``launch.dp`` servers over the Ray cluster this process is connected to (``ray.init`` first);
    ``async with`` stops them. See the module docstring."""

    def __init__(
        self, launch: EngineLaunch, log_dir: str | Path, resources: RayResources | None = None, grace_s: float = 10.0
    ) -> None:
        self.resources = resources or RayResources()
        engine = launch.engine
        if isinstance(engine, EmbeddedEngineConfig) and "threads" not in engine.model_fields_set:
            # the group's CPUs, not the node's
            threads = max(1, int(self.resources.cpus_per_server))
            launch = dataclasses.replace(launch, engine=engine.model_copy(update={"threads": threads}))
        self.launch = launch
        self.log_dir = Path(log_dir).absolute()
        self.grace_s = grace_s
        self.placement_groups: list = []
        self.hosts: list = []
        #: One entry per DP rank once started: address, node_ip, node_id.
        self.servers: list[dict[str, str]] = []

    @property
    def addresses(self) -> list[str]:
        return [s["address"] for s in self.servers]

    async def start(self) -> list[str]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.resources.bundle
        try:
            for _ in range(self.launch.dp):
                self.placement_groups.append(placement_group([bundle], strategy="STRICT_PACK"))
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(pg.ready() for pg in self.placement_groups)), self.resources.ready_timeout_s
                )
            except TimeoutError:
                raise LaunchError(
                    f"the Ray cluster had no room for {self.launch.dp} placement groups of {bundle} within "
                    f"{self.resources.ready_timeout_s:.0f} s (its resources: {ray.cluster_resources()})"
                ) from None
            host_class = ray.remote(ServerHost)
            for rank, group in enumerate(self.placement_groups):
                strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
                self.hosts.append(
                    host_class.options(
                        num_cpus=self.resources.cpus_per_server,
                        num_gpus=self.resources.gpus_per_server,
                        scheduling_strategy=strategy,
                    ).remote(self.launch, rank, str(self.log_dir))
                )
            self.servers = list(
                await asyncio.gather(*(host.start.remote(self.launch.startup_timeout_s) for host in self.hosts))
            )
        except BaseException:
            await self.stop()
            raise
        return self.addresses

    async def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        async def stop_host(host) -> None:
            with contextlib.suppress(Exception):  # a dead host took its server with it
                await host.stop.remote(self.grace_s)
            ray.kill(host)

        await asyncio.gather(*(stop_host(host) for host in self.hosts))
        groups, self.hosts, self.placement_groups = self.placement_groups, [], []
        # removal blocks while Ray's control store is unreachable (a local Ray that got the terminal's Ctrl-C too):
        # bounded, in a daemon thread, so stopping never hangs; the groups die with that Ray anyway
        remover = threading.Thread(target=lambda: [remove_placement_group(g) for g in groups], daemon=True)
        remover.start()
        await asyncio.to_thread(remover.join, _REMOVE_TIMEOUT_S)
        if remover.is_alive():
            log.warning("placement groups not confirmed removed within %.0f s (is Ray still up?)", _REMOVE_TIMEOUT_S)

    def write_discovery(self, path: str | Path) -> Path:
        """The servers with their DP rank, node and placement group (``Router.from_discovery_file`` reads it)."""
        servers = [
            {**server, "dp_rank": rank, "adapter": self.launch.adapter, "placement_group": group.id.hex()}
            for rank, (server, group) in enumerate(zip(self.servers, self.placement_groups, strict=True))
        ]
        return write_discovery(path, servers, self.launch.client_security)
