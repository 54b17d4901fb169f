"""Load reported on completions (GenerateComplete.load): the Router takes a server's load from each generation it
finishes there and polls GetLoad only from servers it has not heard from within load_poll_interval_s, so W
Routers over S servers do not each poll all S while they route; a server carrying none of its requests is polled
less often (idle_load_poll_interval_s), but still polled (liveness)."""

from __future__ import annotations

import asyncio
import time

from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.router.endpoint import Endpoint
from agentloop_grpc.router.lowest_load import LowestLoad
from agentloop_grpc.router.metrics import RouterMetrics
from agentloop_grpc.router.versions import WeightVersions
from agentloop_grpc.v1 import generation_pb2

from .conftest import address, fake_servers
from .test_routing import _until, params

FAST = {"health_retry_interval_s": 0.05, "backoff_initial_s": 0.01}


def _count_polls(endpoint: Endpoint) -> list[int]:
    """Count the GetLoad polls ``endpoint`` sends from now on (the returned list's one element)."""
    polls = [0]
    get_load = endpoint.generate.GetLoad

    def counted(*args, **kwargs):
        polls[0] += 1
        return get_load(*args, **kwargs)

    endpoint.generate.GetLoad = counted  # type: ignore[assignment]  # counts the endpoint's polls
    return polls


async def test_a_completion_brings_the_servers_load_without_a_poll() -> None:
    """Another client holds three requests on the server; this Router never polls (an hour's interval), yet after
    one generation there it knows the server carries them."""
    never = RouterConfig(load_poll_interval_s=3600, **FAST)
    async with fake_servers(1, token_latency_s=0.01) as servers:
        server = address(servers[0])
        async with Router([server], RouterConfig(load_poll_interval_s=0.05, **FAST)) as other, \
                Router([server], never) as router:
            await asyncio.gather(other.fleet.wait_ready(1), router.fleet.wait_ready(1))
            held = [asyncio.create_task(other.generate(GenerateCall(f"held{i}", [1, 2, i], params(500))))
                    for i in range(3)]
            await _until(lambda: other.fleet.endpoint(server).reported_load == 3)
            endpoint = router.fleet.endpoint(server)
            assert endpoint.load == 0  # nothing polled, nothing of ours in flight
            await router.generate(GenerateCall("mine", [4, 5, 6], params(2)))
            assert (endpoint.reported_load, endpoint.load) == (3, 3)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)


async def test_a_server_that_answers_generations_is_not_polled_and_an_idle_one_is() -> None:
    config = RouterConfig(load_poll_interval_s=0.1, idle_load_poll_interval_s=0.1, **FAST)
    async with fake_servers(2, token_latency_s=0.001) as servers, \
            Router([address(s) for s in servers], config) as router:
        await router.fleet.wait_ready(2)
        first = await router.generate(GenerateCall("busy", [1, 2, 3], params(2)))
        busy = first.servers[0]
        idle = next(address(s) for s in servers if address(s) != busy)
        polls = {a: _count_polls(router.fleet.endpoint(a)) for a in (busy, idle)}
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # fifteen poll intervals of generations on one session
            result = await router.generate(GenerateCall("busy", [1, 2, 3], params(2)))
            assert result.servers == (busy,)
            await asyncio.sleep(0.01)
        assert polls[busy][0] <= 1, f"{polls[busy][0]} polls of a server that reported its load on every completion"
        assert polls[idle][0] >= 5, f"only {polls[idle][0]} polls of the idle server in 1.5 s"


async def test_a_server_carrying_our_requests_is_polled_each_interval_an_idle_one_each_idle_interval() -> None:
    """A long generation reports nothing until it ends: its server is polled every interval (its liveness guards
    our request); a server with none of ours only every idle interval."""
    config = RouterConfig(load_poll_interval_s=0.05, idle_load_poll_interval_s=0.5, **FAST)
    async with fake_servers(2, token_latency_s=0.01) as servers, \
            Router([address(s) for s in servers], config) as router:
        await router.fleet.wait_ready(2)
        long = asyncio.create_task(router.generate(GenerateCall("long", [1, 2, 3], params(1000))))
        await _until(lambda: router.session_server("long") is not None)
        busy = router.session_server("long")
        idle = next(address(s) for s in servers if address(s) != busy)
        polls = {a: _count_polls(router.fleet.endpoint(a)) for a in (busy, idle)}
        await asyncio.sleep(1.5)
        long.cancel()
        await asyncio.gather(long, return_exceptions=True)
        assert polls[busy][0] >= 10, f"only {polls[busy][0]} polls in 1.5 s of a server carrying our request"
        assert 1 <= polls[idle][0] <= 4, f"{polls[idle][0]} polls in 1.5 s of a server idle to us"


async def test_a_rise_in_preemptions_keeps_new_sessions_away_for_a_poll_interval() -> None:
    """Completions report far more often than polls did: a rise seen in one report must not be forgotten at the
    next, a moment later, or KV back-off would last milliseconds."""
    config = RouterConfig(load_poll_interval_s=0.2)
    endpoint = Endpoint("127.0.0.1:1", config, RouterMetrics(), WeightVersions(RouterMetrics()), LowestLoad())
    try:
        endpoint.report_load(generation_pb2.GetLoadResponse(preemptions=3))  # a server's first report: its count
        endpoint.report_load(generation_pb2.GetLoadResponse(preemptions=3))
        assert not endpoint.pressured
        endpoint.report_load(generation_pb2.GetLoadResponse(preemptions=4))
        assert endpoint.pressured
        endpoint.report_load(generation_pb2.GetLoadResponse(preemptions=4))  # no rise since, within the interval
        assert endpoint.pressured
        await asyncio.sleep(0.25)
        endpoint.report_load(generation_pb2.GetLoadResponse(preemptions=4))
        assert not endpoint.pressured
        endpoint.report_load(generation_pb2.GetLoadResponse(kv_cache_usage=0.99, preemptions=4))
        assert endpoint.pressured  # a full KV cache counts at once, as before
    finally:
        await endpoint.close()
