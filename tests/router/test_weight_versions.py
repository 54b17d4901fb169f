"""A server that returns after a weight update serves the old weights (issue 18, fault 2): the Router holds it out
of routing until it has the fleet's version again, says so in its log and metrics, and routes to it after the
next update."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.router import GenerateCall, NoHealthyServerError, Router, RouterConfig
from agentloop_grpc.router.metrics import RouterMetrics
from agentloop_grpc.router.versions import ExpectedVersion, WeightVersions

from .conftest import ServerProcess, address, fake_servers, free_port
from .test_liveness import _routed_to_again
from .test_routing import FAST, _until, params

pytestmark = pytest.mark.fault

TENSOR = NamedTensor("w", "float32", (1,), b"\0\0\0\0")


def _behind(router: Router, server: str) -> float:
    return router.metrics.value("agentloop_router_server_behind", server=server)


async def _servers_of(router: Router, sessions: int, prefix: str) -> list[str]:
    calls = (GenerateCall(f"{prefix}{i}", [1, 2, 3], params(2)) for i in range(sessions))
    return [(await router.generate(call)).servers[0] for call in calls]


async def test_a_server_restarted_after_an_update_is_held_out_until_the_next(server_processes, caplog):
    port = free_port()
    server_processes.append(ServerProcess(port=port, token_latency_ms=1))
    server_processes.append(ServerProcess(token_latency_ms=1))
    restarted, other = (p.address for p in server_processes)
    config = FAST.model_copy(update={"idle_load_poll_interval_s": 1.0})  # how long a stale load may stand
    async with Router([restarted, other], config) as pusher, Router([restarted, other], config) as observer:
        await pusher.fleet.wait_ready(2)
        await observer.fleet.wait_ready(2)
        (await pusher.fleet.update_weights([TENSOR], weight_version=3)).raise_for_errors()
        # the observer pushed nothing: it learns the fleet's version from what its generations carry
        results = [await observer.generate(GenerateCall(f"o{i}", [1, 2, 3], params(2))) for i in range(8)]
        assert {v for r in results for v in r.weight_versions} == {3}
        await _until(lambda: observer.fleet.weight_version == 3 and not observer.fleet.held_out)

        server_processes[0].kill()
        await _until(lambda: not any(r.fleet.servers[restarted].healthy for r in (pusher, observer)))
        with caplog.at_level(logging.WARNING, logger="agentloop_grpc.router.versions"):
            server_processes.append(ServerProcess(port=port, token_latency_ms=1))  # back at its initial weights
            for router in (pusher, observer):
                await _until(lambda router=router: router.fleet.servers[restarted].healthy)  # SERVING, version 0
                assert router.fleet.held_out == {restarted}
                assert _behind(router, restarted) == 1 and _behind(router, other) == 0
                assert router.metrics.value("agentloop_router_expected_weight_version") == 3
                assert router.metrics.value("agentloop_router_server_weight_version", server=restarted) == 0
                assert set(await _servers_of(router, 16, "during")) == {other}
        assert any("held out of routing" in r.getMessage() and restarted in r.getMessage() for r in caplog.records)

        # another client's generation runs on the held-out server while the update comes: the last load both
        # Routers polled there counts it, and stands after it ends until their next poll of that idle server
        async with Router([restarted], FAST) as bystander:
            await bystander.fleet.wait_ready()
            other_client = asyncio.create_task(bystander.generate(GenerateCall("by", [4, 5, 6], params(2000))))
            await _until(lambda: all(r.fleet.servers[restarted].reported_load for r in (pusher, observer)))
            (await pusher.fleet.update_weights([TENSOR], weight_version=4)).raise_for_errors()
            assert not pusher.fleet.held_out and _behind(pusher, restarted) == 0
            # the observer sees the update in its poll of the held-out server's info (and its load, just after)
            await _until(lambda: not observer.fleet.held_out)
            await asyncio.sleep(0.1)
            other_client.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await other_client
        assert await _routed_to_again(pusher, restarted)
        assert observer.fleet.weight_version == 4 and await _routed_to_again(observer, restarted)


async def test_a_held_out_server_updated_by_someone_else_comes_back() -> None:
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        stale, current = address(servers[0]), address(servers[1])
        await servers[1].lifecycle.update_weights([TENSOR], 2, flush_cache=False)
        await router.fleet.server_info()  # any fresh GetServerInfo shows the versions
        assert router.fleet.weight_version == 2 and router.fleet.held_out == {stale}
        assert set(await _servers_of(router, 8, "a")) == {current}
        await servers[0].lifecycle.update_weights([TENSOR], 2, flush_cache=False)
        await _until(lambda: not router.fleet.held_out)
        assert await _routed_to_again(router, stale)


async def test_when_every_server_is_behind_the_error_says_so() -> None:
    config = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, no_server_wait_s=0.2)
    expected = ExpectedVersion()
    async with fake_servers(1) as servers, Router([address(servers[0])], config, expected=expected) as router:
        await router.fleet.wait_ready()
        expected.raise_to(5)  # e.g. the trainer pushed through another Fleet sharing the version
        assert router.fleet.held_out == {address(servers[0])}
        with pytest.raises(NoHealthyServerError, match="held out below weight version 5"):
            await router.generate(GenerateCall("s", [1, 2, 3], params(2)))


def test_versions_only_grow_and_generations_never_lower_a_servers() -> None:
    versions = WeightVersions(RouterMetrics())
    versions.report("a", 3)
    versions.report("b", 1)
    assert versions.expected == 3 and versions.behind == {"b"}
    versions.advance("a", 2)  # an old message arriving late
    assert versions.of("a") == 3
    versions.report("a", 0)  # GetServerInfo after a restart is the truth
    assert versions.expected == 3 and versions.behind == {"a", "b"}
    versions.forget("b")
    assert versions.behind == {"a"}
    versions.advance("a", 3)
    assert not versions.behind


def test_fleets_sharing_the_expected_version_hold_out_what_any_of_them_learns() -> None:
    expected = ExpectedVersion()
    first, second = WeightVersions(RouterMetrics(), expected), WeightVersions(RouterMetrics(), expected)
    for versions in (first, second):
        versions.report_all({"a": 0, "b": 0})
    first.report("a", 2)  # the first Fleet's push or GetServerInfo
    # the second holds out what it has not seen at version 2 (its endpoints poll those for their info)
    assert second.expected == 2 and second.behind == {"a", "b"}
    second.report("a", 2)
    assert second.behind == {"b"} and not expected.raise_to(1)
    assert first.expected == 2 and first.behind == {"b"}


async def test_an_update_during_generations_holds_no_server_out() -> None:
    async with fake_servers(2, token_latency_s=0.002) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        calls = [GenerateCall(f"r{i}", [1, 2, i], params(200)) for i in range(8)]
        running = [asyncio.create_task(router.generate(call)) for call in calls]
        await asyncio.sleep(0.1)
        (await router.fleet.update_weights([TENSOR], weight_version=1)).raise_for_errors()
        results = await asyncio.gather(*running)
        assert {r.weight_versions[-1] for r in results} == {1}  # every one of them switched mid-way
        assert not router.fleet.held_out and router.fleet.weight_version == 1
        assert set(await _servers_of(router, 16, "after")) == {address(s) for s in servers}


async def test_servers_a_push_updated_together_are_never_held_out_for_each_other(caplog) -> None:
    tensor = NamedTensor("w", "float32", (1,), b"\0\0\0\0")
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        with caplog.at_level(logging.WARNING, logger="agentloop_grpc.router.versions"):
            (await router.fleet.update_weights([tensor], 1)).raise_for_errors()
        assert router.fleet.weight_version == 1 and not router.fleet.held_out
        assert not [r for r in caplog.records if "held out" in r.getMessage()]  # the first answer held out the other
