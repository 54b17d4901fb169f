"""cache_aware placement over real fake-engine servers on loopback: a GRPO group's samples share one server (and its
prefill), a new session goes where its prompt's prefix is, a server under KV pressure takes no new session, and
the Router keeps nothing of a group or a session once they end. The previous default is the control."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, Router, RouterConfig

from .conftest import address, fake_servers

FAST = {"load_poll_interval_s": 0.05, "health_retry_interval_s": 0.05, "backoff_initial_s": 0.01}
PROMPT = list(range(3, 300))  # the group's prompt: 296 tokens, 18 blocks of the fake's 16


def _addresses(servers) -> list[str]:
    return [address(server) for server in servers]


def params(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, ignore_eos=True)


async def _group_run(placement: str, groups: int = 2, size: int = 4):
    """``groups`` GRPO groups of ``size`` samples, all in flight at once over 2 servers: (servers used per group,
    prompt tokens served from cache, the Router after every session closed). The prefix record is off: the group
    alone keeps its samples together."""
    # built as a caller overriding a base config would: model_copy leaves the placement a plain string
    config = RouterConfig(**FAST).model_copy(update={"placement": placement, "prefix_index_blocks": 0})
    async with fake_servers(2, token_latency_s=0.002) as servers, Router(_addresses(servers), config) as router:
        await router.fleet.wait_ready(2)

        async def sample(group: int, index: int):
            prompt = [group + 1000, *PROMPT]
            call = GenerateCall(f"g{group}-{index}", prompt, params(40), group_id=f"g{group}")
            result = await router.generate(call)
            assert router.live_groups >= 1
            router.close_session(call.session_id)
            return group, result

        results = await asyncio.gather(*(sample(g, i) for g in range(groups) for i in range(size)))
        used = {g: {r.servers[0] for group, r in results if group == g} for g in range(groups)}
        cached = sum(r.cached_prompt_tokens for _, r in results)
        return used, cached, (router.live_sessions, router.live_groups)


async def test_a_groups_samples_share_one_server_and_its_prefill() -> None:
    used, cached, left = await _group_run("cache_aware")
    assert all(len(servers) == 1 for servers in used.values()), used
    assert used[0] != used[1]  # the second group went to the less-loaded server
    assert left == (0, 0)  # nothing kept of ended sessions or their groups
    # the previous default spreads each group's samples as strangers over both servers
    used_before, cached_before, _ = await _group_run("sticky_least_loaded")
    assert all(len(servers) == 2 for servers in used_before.values()), used_before
    assert cached > cached_before  # each group prefilled its prompt on one server, not on two


async def test_a_group_larger_than_the_bound_spills_onto_one_more_server() -> None:
    config = RouterConfig(placement="cache_aware", imbalance_min_gap=2, prefix_index_blocks=0, **FAST)
    async with fake_servers(3, token_latency_s=0.005) as servers, Router(_addresses(servers), config) as router:
        await router.fleet.wait_ready(3)
        calls = [GenerateCall(f"s{i}", PROMPT, params(400), group_id="big") for i in range(8)]
        tasks = []
        for call in calls:  # one after another, each in flight before the next is placed
            tasks.append(asyncio.create_task(router.generate(call)))
            await _until(lambda: sum(e.in_flight for e in router.fleet.servers.values()) == len(tasks))
        placed = [router.session_server(call.session_id) for call in calls]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # within a gap of 2 a server takes 3 of the group while the others hold none; the rest fill the fewest others
    counts = sorted(placed.count(a) for a in set(placed))
    assert len(counts) <= 3 and counts[-1] >= 3, placed
    assert placed[:3] == [placed[0]] * 3, placed


async def test_a_new_session_goes_where_its_prompt_prefix_was_sent() -> None:
    async with fake_servers(3) as servers, Router([address(s) for s in servers], RouterConfig(**FAST)) as router:
        await router.fleet.wait_ready(3)
        system = [5, 6, 7] * 100
        first = await router.generate(GenerateCall("first", [*system, 1], params(4)))
        later = [await router.generate(GenerateCall(f"later{i}", [*system, 2, i], params(4))) for i in range(6)]
        assert {r.servers[0] for r in later} == set(first.servers)
        assert all(r.cached_prompt_tokens >= 256 for r in later)
    # without the prefix record, idle servers are chosen by a hash of the session id: they spread
    config = RouterConfig(placement="sticky_least_loaded", **FAST)
    async with fake_servers(3) as servers, Router([address(s) for s in servers], config) as router:
        await router.fleet.wait_ready(3)
        spread = [await router.generate(GenerateCall(f"later{i}", [*system, 2, i], params(4))) for i in range(6)]
        assert len({r.servers[0] for r in spread}) > 1


async def test_a_server_under_kv_pressure_takes_no_new_session() -> None:
    """Server a holds one long request that fills its KV; b holds two short ones. a is the less loaded, but new
    sessions go to b; a's own session goes on there."""
    roomy = FakeEngineConfig(token_latency_s=0.01, max_running=8, max_model_len=4096)
    tight = FakeEngineConfig(token_latency_s=0.01, max_running=1, max_model_len=1024)
    async with AsyncExitStack() as stack:
        servers = []
        for engine_config in (tight, roomy):
            server = await create_server(FakeEngine(engine_config), "127.0.0.1:0")
            await start_adapter(server)
            stack.push_async_callback(server.stop, 0.5)
            servers.append(address(server))
        a, b = servers
        config = RouterConfig(kv_pressure_usage=0.5, pressure_wait_s=0.3, **FAST)
        router = await stack.enter_async_context(Router([a], config))
        await router.fleet.wait_ready(1)
        long = asyncio.create_task(router.generate(GenerateCall("long", list(range(3, 600)), params(300))))
        await _until(lambda: router.fleet.endpoint(a).pressured)
        await router.fleet.add_server(b)
        await router.fleet.wait_ready(2)
        busy = [asyncio.create_task(router.generate(GenerateCall(f"busy{i}", [1, 2, 3], params(300)))) for i in
                range(2)]
        await _until(lambda: router.fleet.endpoint(b).in_flight == 2)
        assert router.fleet.endpoint(a).load < router.fleet.endpoint(b).load
        newcomers = [await router.generate(GenerateCall(f"new{i}", [9, 9, i], params(2))) for i in range(4)]
        assert {r.servers[0] for r in newcomers} == {b}
        assert router.session_server("long") == a
        for task in (long, *busy):
            task.cancel()
        await asyncio.gather(long, *busy, return_exceptions=True)


async def test_while_every_server_is_under_pressure_a_new_session_waits_then_goes() -> None:
    # room for both requests at once (max_running 2), so only the wait can hold the newcomer back
    tight = {"token_latency_s": 0.01, "max_running": 2, "max_model_len": 1024}
    async with fake_servers(1, **tight) as servers:
        config = RouterConfig(kv_pressure_usage=0.25, pressure_wait_s=0.5, **FAST)
        async with Router([address(servers[0])], config) as router:
            await router.fleet.wait_ready(1)
            long = asyncio.create_task(router.generate(GenerateCall("long", list(range(3, 600)), params(300))))
            await _until(lambda: router.fleet.endpoint(address(servers[0])).pressured)
            started = time.monotonic()
            result = await router.generate(GenerateCall("new", [1, 2, 3], params(2)))
            assert time.monotonic() - started >= 0.4  # it waited out the bound rather than queueing at once
            assert len(result.token_ids) == 2
            long.cancel()
            await asyncio.gather(long, return_exceptions=True)


async def _until(condition, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


class _RecordingFake(FakeEngine):
    """The fake engine, noting the EndSessions it is told (what it demotes is the engine tests' business)."""

    def __init__(self, config: FakeEngineConfig) -> None:
        super().__init__(config)
        self.ended: list[str] = []
        self.calls = self.demoted = 0

    async def end_sessions(self, session_ids):
        self.ended += session_ids
        self.calls += 1
        self.demoted += await super().end_sessions(session_ids)
        return self.demoted


async def test_ended_sessions_are_told_to_their_server_in_one_batch() -> None:
    engine = _RecordingFake(FakeEngineConfig())
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with Router([address(server)], RouterConfig(**FAST)) as router:
            await router.fleet.wait_ready(1)
            for i in range(5):
                await router.generate(GenerateCall(f"t{i}", [i + 100, *PROMPT], params(4)))
            for i in range(5):
                router.close_session(f"t{i}")
            router.close_session("never-ran")  # unknown to the Router: nothing to tell
            await _until(lambda: len(engine.ended) == 5)
            assert sorted(engine.ended) == [f"t{i}" for i in range(5)] and engine.calls == 1
            assert engine.demoted > 0
            assert router.live_sessions == 0
    finally:
        await server.stop(grace_s=0.5)
