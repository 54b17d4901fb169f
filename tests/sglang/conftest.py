"""Fixtures of the SGLang adapter tests: one local Ray per session, TP groups of Ray actors holding the
stand-in engine (``standin.py``), and real gRPC servers on loopback serving them through ``SglangEngine``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import ray

from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.engine_adapters.sglang import ActorNaming, SglangEngineConfig, deploy_tp_group

from ..ray_start import init_ray
from .standin import STANDIN_API, CallRecorder

NAMESPACE = "agentloop-sglang-tests"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray for the session (reused if another suite already started one)."""
    started = init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    yield
    if started:
        ray.shutdown()


@dataclass
class StandInGroup:
    """A deployed TP group whose rank-0 actor holds a stand-in engine, and the recorder of its engine calls."""

    naming: ActorNaming
    dp_rank: int
    tp_size: int
    actors: list
    recorder: Any

    def config(self, **overrides) -> SglangEngineConfig:
        values = {"naming": self.naming, "dp_rank": self.dp_rank, "dp_size": self.dp_rank + 1, "tp_size": self.tp_size,
                  "discovery_timeout_s": 10.0, "load_poll_s": 0.2, **overrides}
        return SglangEngineConfig(**values)

    async def calls(self, method: str, count: int = 1, where: Callable[[dict], bool] = lambda _: True,
                    timeout_s: float = 10.0) -> list[dict]:
        """The payloads of ``method`` calls that reached the engine, once at least ``count`` arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [p for m, p in await self.recorder.calls.remote() if m == method and where(p)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.02)


_groups = iter(range(1 << 30))


@asynccontextmanager
async def standin_group(tp_size: int = 1, dp_rank: int = 0, **engine_kwargs) -> AsyncIterator[StandInGroup]:
    """Deploy a fresh TP group (unique prefix) of stand-in actors; kill them afterwards."""
    recorder = ray.remote(CallRecorder).options(num_cpus=0).remote()
    naming = ActorNaming(prefix=f"standin{next(_groups)}", namespace=NAMESPACE)
    kwargs = {"model_path": "standin/model", "tp_size": tp_size, "recorder": recorder, **engine_kwargs}
    actors = deploy_tp_group(naming, dp_rank, tp_size, kwargs, api=STANDIN_API)
    try:
        yield StandInGroup(naming, dp_rank, tp_size, actors, recorder)
    finally:
        for actor in [*actors, recorder]:
            ray.kill(actor)


@pytest.fixture(scope="package")
async def moe_group(ray_cluster) -> AsyncIterator[StandInGroup]:
    """One TP rank serving a MoE stand-in with routed-expert capture on (``standin.py``), shared by the modules
    that need a plain engine (the contract suite) and the routed-experts tests: each group costs seconds of Ray.
    Killed when this folder's tests end, so its actor's process does not outlive them."""
    kwargs = {"num_experts": 8, "enable_return_routed_experts": True}
    async with standin_group(tp_size=1, token_latency_s=0.002, **kwargs) as group:
        yield group


@asynccontextmanager
async def sglang_server(group: StandInGroup, **config) -> AsyncIterator[EngineServer]:
    """A started gRPC server on loopback serving ``group`` through SglangEngine."""
    server = await create_server(make_adapter("sglang", group.config(**config)), "127.0.0.1:0")
    try:
        await start_adapter(server)
        yield server
    finally:
        await server.stop(grace_s=1)
