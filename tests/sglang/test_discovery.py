"""Discovery: the adapter finds its TP group's named actors, talks to rank 0, and refuses incomplete groups."""

from __future__ import annotations

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.engine_adapters.sglang import (
    ActorNaming,
    SglangEngine,
    SglangEngineActor,
    SglangEngineConfig,
    TpGroupError,
    TpRank,
    deploy_tp_group,
)
from agentloop_grpc.engine_adapters.sglang.actor import NotLeaderError
from agentloop_grpc.engine_adapters.sglang.discovery import find_tp_group

from .conftest import NAMESPACE, standin_group
from .standin import STANDIN_API

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _config(naming: ActorNaming, tp_size: int, dp_rank: int = 0, timeout_s: float = 0.3) -> SglangEngineConfig:
    return SglangEngineConfig(naming=naming, dp_rank=dp_rank, dp_size=2, tp_size=tp_size, discovery_timeout_s=timeout_s)


def _deploy_ranks(naming: ActorNaming, ranks: list[TpRank]) -> list:
    """Named actors for exactly ``ranks`` (some missing or misnamed on purpose)."""
    actor = ray.remote(SglangEngineActor)
    return [
        actor.options(name=r.name, namespace=naming.namespace, num_cpus=0).remote(r, {}, STANDIN_API)
        for r in ranks
    ]


async def test_finds_rank_zero_among_its_groups_tp_actors() -> None:
    async with standin_group(tp_size=3, dp_rank=1) as group, standin_group(tp_size=1, dp_rank=0) as other:
        found = await find_tp_group(group.config())
        assert found.names == tuple(f"{group.naming.prefix}-dp1-tp{r}" for r in range(3))
        assert await found.leader.identity.remote() == TpRank(group.naming, 1, 0, 3)
        engine = SglangEngine(group.config())
        facts = await engine.start(lambda: 0)
        try:
            assert facts.tp_size == 3 and facts.dp_rank == 1
            assert await group.calls("async_generate", count=0) == []
            # the engine was created in this group's rank-0 actor only: the other group's is untouched
            with pytest.raises(NotLeaderError):
                await other.actors[0].load.remote()
            with pytest.raises(NotLeaderError, match="TP rank 1"):
                await group.actors[1].start.remote()
        finally:
            await engine.shutdown()
        assert await group.calls("shutdown")


async def test_incomplete_group_names_the_missing_ranks() -> None:
    naming = ActorNaming(prefix="gap", namespace=NAMESPACE)
    actors = _deploy_ranks(naming, [TpRank(naming, 0, 0, 3), TpRank(naming, 0, 2, 3)])
    try:
        await actors[0].identity.remote()
        with pytest.raises(TpGroupError, match=r"incomplete .*missing \['gap-dp0-tp1'\]"):
            await find_tp_group(_config(naming, tp_size=3))
    finally:
        for actor in actors:
            ray.kill(actor)


async def test_missing_group_is_a_clear_error_and_the_server_stays_not_serving() -> None:
    naming = ActorNaming(prefix="nobody", namespace=NAMESPACE)
    server = await create_server(SglangEngine(_config(naming, tp_size=2)), "127.0.0.1:0")
    try:
        with pytest.raises(TpGroupError, match=r"is missing in Ray namespace .*'nobody-dp0-tp0', 'nobody-dp0-tp1'"):
            await start_adapter(server)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            health = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop(grace_s=0)


async def test_group_larger_than_tp_size_is_refused() -> None:
    async with standin_group(tp_size=2) as group:
        with pytest.raises(TpGroupError, match="larger than tp_size = 1"):
            await find_tp_group(group.config(tp_size=1))


async def test_actor_under_a_wrong_name_is_refused() -> None:
    naming = ActorNaming(prefix="swapped", namespace=NAMESPACE)
    actors = _deploy_ranks(naming, [TpRank(naming, 0, 0, 2)])
    # rank 1's name, but the actor believes it is rank 0 of a group of 2 in DP rank 1
    actors.append(
        ray.remote(SglangEngineActor)
        .options(name=naming.name(0, 1), namespace=NAMESPACE, num_cpus=0)
        .remote(TpRank(naming, 1, 0, 2), {}, STANDIN_API)
    )
    try:
        with pytest.raises(TpGroupError, match=r"'swapped-dp0-tp1' reports .*expected TP rank 1 of 2"):
            await find_tp_group(_config(naming, tp_size=2))
    finally:
        for actor in actors:
            ray.kill(actor)


async def test_custom_naming_template_and_namespace() -> None:
    naming = ActorNaming(prefix="policy", namespace=f"{NAMESPACE}-custom", template="{prefix}/r{dp_rank}.{tp_rank}")
    actors = deploy_tp_group(naming, 0, 2, {}, api=STANDIN_API)
    try:
        found = await find_tp_group(_config(naming, tp_size=2, timeout_s=10))
        assert found.names == ("policy/r0.0", "policy/r0.1")
        # the same names in another namespace are invisible
        other = ActorNaming(prefix="policy", namespace=NAMESPACE, template=naming.template)
        with pytest.raises(TpGroupError, match="missing"):
            await find_tp_group(_config(other, tp_size=2))
    finally:
        for actor in actors:
            ray.kill(actor)


@pytest.mark.parametrize("template", ["{prefix}-{tp_rank}", "{prefix}-{dp_rank}-{tp_rank}-{extra}", "fixed"])
def test_naming_template_must_use_prefix_dp_and_tp_rank(template: str) -> None:
    with pytest.raises(ValueError, match="template"):
        ActorNaming(prefix="p", template=template)
