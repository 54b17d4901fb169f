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

Once started, ``watch`` follows every server until stopped: a server is lost when its process exits or its host
actor dies (Ray declares an actor dead when its node dies: the GCS's health checks of the node's raylet failed
``health_check_failure_threshold`` times, ``health_check_period_ms`` apart; a node that is only unreachable is not
a loss until then). A loss is logged (server, DP rank, node, cause) and the discovery file rewritten without it.
Then, with ``restart_lost``, the server is started again in the same placement group: Ray reschedules a group whose
node died (its state RESCHEDULING) onto a live node with room, and keeps it in place when only the process died;
the new server's address goes into the discovery file, whose readers (``follow_discovery_file``) add it. Without
``restart_lost`` the group is removed, so Ray does not hold a reservation nobody uses. A restarted server serves
the weights of its engine config: a Router holds it out of routing until it reports the fleet's weight version. A
server lost within a minute of its start is started again after a back-off (``launcher.py``'s docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    #: Custom Ray resources each group reserves too (e.g. ``{"engine_node": 1}`` to keep servers on the nodes that
    #: declare it with ``ray start --resources``).
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cpus_per_server <= 0 or self.gpus_per_server < 0:
            raise ValueError("cpus_per_server must be > 0 and gpus_per_server >= 0")
        if any(name in ("CPU", "GPU") or amount <= 0 for name, amount in self.resources.items()):
            raise ValueError("resources: custom resources (not CPU or GPU), each amount > 0")

    @property
    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_server, **({"GPU": self.gpus_per_server} if self.gpus_per_server else {}),
                **self.resources}


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

    async def wait_exit(self) -> int:
        """Return when the server process exits (its exit code)."""
        assert self.server.process is not None
        return await self.server.process.wait()

    def server_pid(self) -> int | None:
        return self.server.process.pid if self.server.process else None


class RayEngineLauncher(Launcher):
    """Start ``launch.dp`` servers over the Ray cluster this process is connected to (``ray.init`` first);
    ``async with`` stops them. See the module docstring."""

    def __init__(
        self, launch: EngineLaunch, log_dir: str | Path, resources: RayResources | None = None, grace_s: float = 10.0,
        restart_lost: bool = False,
    ) -> None:
        """``restart_lost``: ``watch`` starts a lost server again (see the module docstring)."""
        super().__init__(restart_lost)
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
        #: One entry per DP rank once started: address, node_ip, node_id (None while a lost one is down).
        self.servers: list[dict[str, str] | None] = []

    @property
    def addresses(self) -> list[str]:
        return [s["address"] for s in self.servers if s is not None]

    async def start(self) -> list[str]:
        import ray
        from ray.util.placement_group import placement_group

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
            self.hosts = [self._host(rank) for rank in range(self.launch.dp)]
            self.servers = list(
                await asyncio.gather(*(host.start.remote(self.launch.startup_timeout_s) for host in self.hosts))
            )
        except BaseException:
            await self.stop()
            raise
        return self.addresses

    def _host(self, rank: int):
        """A host actor for DP rank ``rank``, in its placement group."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.placement_groups[rank], placement_group_bundle_index=0)
        resources = {name: amount for name, amount in self.resources.bundle.items() if name not in ("CPU", "GPU")}
        return ray.remote(ServerHost).options(
            num_cpus=self.resources.cpus_per_server, num_gpus=self.resources.gpus_per_server, resources=resources,
            scheduling_strategy=strategy,
        ).remote(self.launch, rank, str(self.log_dir))

    # -- watching (the module docstring) ----------------------------------------------------------------------

    async def _wait_lost(self, rank: int) -> str:
        server = self.servers[rank]
        assert server is not None
        cause = await self._lost(self.hosts[rank], server["node_id"])
        self.servers[rank] = None
        await self._discard_host(rank)
        where = f"node {server['node_ip']} (Ray node {server['node_id'][:12]})"
        return f"engine server {server['address']} (dp rank {rank}) on {where} lost: {cause}"

    async def _start_again(self, rank: int) -> str:
        server = self.servers[rank] = await self._restart(rank)
        return f"on node {server['node_ip']} at {server['address']}"

    async def _give_up(self, rank: int) -> str:
        # the group goes too: Ray would otherwise hold it, or place it whenever room appears, for nobody
        await asyncio.to_thread(self._remove_group, rank)
        return "; its placement group is removed"

    async def _lost(self, host, node_id: str) -> str:
        """Wait until the server of ``host`` is lost; return the cause."""
        import ray

        while True:
            try:
                code = await host.wait_exit.remote()
                return f"its server process exited with code {code}"
            except ray.exceptions.ActorUnavailableError:  # unreachable for now (a partition): not dead yet
                await asyncio.sleep(1.0)
            except ray.exceptions.RayActorError as error:
                return await asyncio.to_thread(_death_cause, error, node_id)

    async def _restart(self, rank: int) -> dict[str, str]:
        group = self.placement_groups[rank]
        try:  # a group whose node died is RESCHEDULING until Ray has placed its bundle on a live node with room
            await asyncio.wait_for(group.ready(), self.resources.ready_timeout_s)
        except TimeoutError:
            raise LaunchError(f"no node had room for its placement group ({self.resources.bundle}) within "
                              f"{self.resources.ready_timeout_s:.0f} s") from None
        self.hosts[rank] = self._host(rank)
        try:
            return await self.hosts[rank].start.remote(self.launch.startup_timeout_s)
        except Exception as error:  # noqa: BLE001 - a LaunchError from the actor, or its death, as Ray wraps them
            await self._discard_host(rank)
            raise LaunchError(str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)) from None

    async def _discard_host(self, rank: int) -> None:
        import ray

        with contextlib.suppress(Exception):  # dead already, most often
            ray.kill(self.hosts[rank])

    def _remove_group(self, rank: int) -> None:
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):
            remove_placement_group(self.placement_groups[rank])

    # -- stopping ---------------------------------------------------------------------------------------------

    async def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        await self._stop_watching()

        async def stop_host(host) -> None:
            with contextlib.suppress(Exception):  # a dead host took its server with it
                await host.stop.remote(self.grace_s)
            ray.kill(host)

        await asyncio.gather(*(stop_host(host) for host in self.hosts))
        groups, self.hosts, self.placement_groups = self.placement_groups, [], []
        # removal blocks while Ray's control store is unreachable (a local Ray that got the terminal's Ctrl-C too):
        # bounded, in a daemon thread, so stopping never hangs; the groups die with that Ray anyway
        def remove() -> None:
            for group in groups:
                with contextlib.suppress(Exception):  # removed already (a lost server's, not restarted)
                    remove_placement_group(group)

        remover = threading.Thread(target=remove, daemon=True)
        remover.start()
        await asyncio.to_thread(remover.join, _REMOVE_TIMEOUT_S)
        if remover.is_alive():
            log.warning("placement groups not confirmed removed within %.0f s (is Ray still up?)", _REMOVE_TIMEOUT_S)

    def write_discovery(self, path: str | Path) -> Path:
        """The servers with their DP rank, node and placement group (``Router.from_discovery_file`` reads it); a
        lost server is left out until it is restarted."""
        servers = [
            {**server, "dp_rank": rank, "adapter": self.launch.adapter, "placement_group": group.id.hex()}
            for rank, (server, group) in enumerate(zip(self.servers, self.placement_groups, strict=True))
            if server is not None
        ]
        return write_discovery(path, servers, self.launch.client_security)


def _death_cause(error: Exception, node_id: str) -> str:
    """Why Ray says the host actor on ``node_id`` died, in a line: its node died (with Ray's reason), or Ray's
    message."""
    import ray

    node: dict = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
    if node and not node.get("Alive", True):
        reason = node.get("DeathReasonMessage") or node.get("DeathReason") or ""
        return f"its node died ({reason})" if reason else "its node died"
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.startswith("\t") and "died unexpectedly before finishing" not in line]
    return " ".join(lines) or type(error).__name__
