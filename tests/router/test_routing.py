"""Router over real servers on loopback: affinity, least-loaded placement, shedding, cancellation, deadlines,
abort, fan-out control, servers added and removed, metrics."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from agentloop_grpc.common.types import ALL_RESOURCES, FinishReason, NamedTensor, PauseMode, SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import (
    GenerateCall,
    InfrastructureError,
    NoHealthyServerError,
    RequestError,
    Router,
    RouterConfig,
)
from agentloop_grpc.serving.metrics import ServerMetrics
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from .conftest import address, fake_servers, sampling_proto

FAST = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)


def params(tokens: int, **fields) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, ignore_eos=True, **fields)


async def _until(condition, timeout_s: float = 30.0) -> None:
    """Wait until ``condition()`` holds (the machine may be slow; tests never assert on speed)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def _server_load(addr: str) -> generation_pb2.GetLoadResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        return await generation_pb2_grpc.TokenGenerateStub(channel).GetLoad(generation_pb2.GetLoadRequest())


async def _wait_idle(addr: str) -> generation_pb2.GetLoadResponse:
    for _ in range(200):
        load = await _server_load(addr)
        if load.running_requests == load.waiting_requests == 0:
            break
        await asyncio.sleep(0.02)
    return load


async def test_session_sticks_to_its_server_and_reuses_its_cache() -> None:
    async with fake_servers(3) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(3)
        prompt = list(range(3, 100))
        first = await router.generate(GenerateCall("s1", prompt, params(8, temperature=0)))
        history = prompt + list(first.token_ids)
        for _ in range(4):
            history += [7, 8, 9]
            result = await router.generate(GenerateCall("s1", history, params(8, temperature=0)))
            assert result.servers == first.servers
            assert result.cached_prompt_tokens > 0  # the previous turn's prefix was reused
            history += list(result.token_ids)
        assert router.metrics.value("agentloop_router_routing_decisions_total", decision="sticky") == 4
        assert router.metrics.value("agentloop_router_routing_decisions_total", decision="new") == 1


async def test_new_sessions_spread_to_least_loaded() -> None:
    async with fake_servers(2, token_latency_s=0.005) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        busy = [
            asyncio.create_task(router.generate(GenerateCall(f"busy{i}", [1, 2, 3], params(2000)))) for i in range(3)
        ]
        await _until(lambda: sum(e.in_flight for e in router.fleet.servers.values()) == 3)
        # three sessions in flight: one server has two of them, so the next new session goes to the other
        counts = {a: e.in_flight for a, e in router.fleet.servers.items()}
        least = min(counts, key=counts.get)
        assert sorted(counts.values()) == [1, 2]
        quick = await router.generate(GenerateCall("newcomer", [4, 5, 6], params(3)))
        assert quick.servers == (least,)
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)


async def test_overloaded_server_sheds_a_session_which_pays_one_miss() -> None:
    config = FAST.model_copy(update={"imbalance_min_gap": 2, "imbalance_ratio": 2.0})
    async with (
        fake_servers(2, token_latency_s=0.005) as servers,
        Router([address(s) for s in servers], config) as router,
    ):
        await router.fleet.wait_ready(2)
        prompt = list(range(3, 80))
        first = await router.generate(GenerateCall("mover", prompt, params(4, temperature=0)))
        home = first.servers[0]
        # another client loads the session's server: the router sees it through GetLoad
        async with grpc.aio.insecure_channel(home) as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)
            hog = {"prompt_ids": [1, 2], "sampling_params": sampling_proto(params(3000))}
            hogs = [stub.Generate(generation_pb2.GenerateRequest(request_id=f"hog{i}", **hog)) for i in range(20)]
            await _until(lambda: router.fleet.servers[home].reported_load >= 20)
            history = [*prompt, *first.token_ids, 5]
            moved = await router.generate(GenerateCall("mover", history, params(4, temperature=0)))
            for call in hogs:
                call.cancel()
        assert moved.servers[0] != home
        assert moved.cached_prompt_tokens == 0  # the price of moving: one cache miss
        assert router.metrics.value("agentloop_router_routing_decisions_total", decision="moved") == 1


async def test_cancelling_the_caller_aborts_in_the_engine() -> None:
    async with fake_servers(1, token_latency_s=0.005) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        task = asyncio.create_task(router.generate(GenerateCall("c", [1, 2, 3], params(3000))))
        while (await _server_load(address(servers[0]))).running_requests == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        load = await _wait_idle(address(servers[0]))
        assert (load.running_requests, load.waiting_requests) == (0, 0)
        assert router.fleet.servers[address(servers[0])].in_flight == 0


async def test_closing_a_stream_early_aborts_in_the_engine() -> None:
    async with fake_servers(1, token_latency_s=0.005) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        stream = router.stream(GenerateCall("early", [1, 2, 3], params(3000)))
        await anext(stream)
        await stream.aclose()
        load = await _wait_idle(address(servers[0]))
        assert (load.running_requests, load.waiting_requests) == (0, 0)


@pytest.mark.parametrize("gives_up", ["cancel", "cancel-unary", "close"])
async def test_a_caller_that_gives_up_is_followed_by_an_explicit_abort(gives_up) -> None:
    """Besides cancelling the call, the Router sends Abort for the attempt, in case the cancellation does not
    reach the engine (a proxy that holds it back, a handler not yet scheduled): a streamed and a unary generate
    whose caller is cancelled, a stream closed early."""
    metrics = ServerMetrics()
    server = await create_server(FakeEngine(FakeEngineConfig(token_latency_s=0.05)), "127.0.0.1:0", metrics=metrics)
    try:
        await start_adapter(server)
        async with Router([address(server)], FAST) as router:
            await router.fleet.wait_ready()
            call = GenerateCall("gives-up", [1, 2, 3], params(30 if gives_up == "cancel-unary" else 3000))
            if gives_up.startswith("cancel"):
                task = asyncio.create_task(router.generate(call))
                await _until(lambda: server.lifecycle.load().running_requests > 0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                stream = router.stream(call)
                await anext(stream)
                await stream.aclose()
            await _until(lambda: metrics.value("agentloop_server_requests_total", method="Abort", code="OK") == 1)
            load = await _wait_idle(address(server))
            assert (load.running_requests, load.waiting_requests) == (0, 0)
            rpc = "unary" if gives_up == "cancel-unary" else "stream"
            assert router.metrics.value("agentloop_router_generate_attempts_total", rpc=rpc) == 1
    finally:
        await server.stop(grace_s=0.5)


async def test_closing_the_router_mid_generate_frees_the_engine_and_leaves_no_failed_task() -> None:
    """Closing the channels cancels the calls in flight; the Abort that follows each has no channel left, which
    must end quietly rather than as a task whose exception nobody retrieves."""
    loop = asyncio.get_running_loop()
    gc.collect()  # what earlier tests left is reported to the handler before ours
    reported: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with fake_servers(1, token_latency_s=0.005) as servers:
            async with Router([address(servers[0])], FAST) as router:
                await router.fleet.wait_ready()
                task = asyncio.create_task(router.generate(GenerateCall("closing", [1, 2, 3], params(3000))))
                await _until(lambda: servers[0].lifecycle.load().running_requests > 0)
            with pytest.raises(asyncio.CancelledError):  # the Router closed under it
                await task
            load = await _wait_idle(address(servers[0]))
            assert (load.running_requests, load.waiting_requests) == (0, 0)
            del task, router
            await asyncio.sleep(0.1)
            gc.collect()  # a finished task with an exception nobody retrieved is reported when it is collected
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not reported, [c.get("exception") or c.get("message") for c in reported]


async def test_deadline_fires_and_the_engine_is_freed() -> None:
    async with fake_servers(1, token_latency_s=0.005) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        with pytest.raises(InfrastructureError, match="deadline"):
            await router.generate(GenerateCall("d", [1, 2, 3], params(3000), timeout_s=0.3))
        load = await _wait_idle(address(servers[0]))
        assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_bad_request_is_not_retried() -> None:
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        with pytest.raises(RequestError) as error:
            await router.generate(GenerateCall("bad", [], params(4)))
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and "prompt_ids" in error.value.details
        assert router.metrics.value("agentloop_router_retries_total", code="INVALID_ARGUMENT") == 0
        assert sum(e.in_flight for e in router.fleet.servers.values()) == 0


async def test_asleep_server_is_skipped_and_used_again_after_wake_up() -> None:
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        sleeper = address(servers[0])
        await servers[0].lifecycle.sleep(1)
        await servers[0].servicer.sync_health()
        for _ in range(100):
            if not router.fleet.servers[sleeper].healthy:
                break
            await asyncio.sleep(0.02)
        results = [await router.generate(GenerateCall(f"w{i}", [1, 2], params(2))) for i in range(4)]
        assert all(r.servers == (address(servers[1]),) for r in results)
        await servers[0].lifecycle.wake_up(ALL_RESOURCES)
        await servers[0].servicer.sync_health()
        await router.fleet.wait_ready(2, timeout_s=10)
        placed = set()
        for i in range(64):  # equal loads: a hash of the session breaks the tie, so it is used again soon
            placed.add((await router.generate(GenerateCall(f"again{i}", [1, 2], params(2)))).servers[0])
            if sleeper in placed:
                break
        assert sleeper in placed


async def test_abort_session_and_abort_all() -> None:
    async with fake_servers(2, token_latency_s=0.005) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        mine = asyncio.create_task(router.generate(GenerateCall("mine", [1, 2, 3], params(3000))))
        others = [asyncio.create_task(router.generate(GenerateCall(f"o{i}", [4, 5], params(3000)))) for i in range(3)]
        await _until(lambda: sum(e.in_flight for e in router.fleet.servers.values()) == 4)
        for addr, endpoint in router.fleet.servers.items():  # the requests reached the engines
            while (await _server_load(addr)).running_requests < endpoint.in_flight:
                await asyncio.sleep(0.01)
        aborted = await router.abort("mine")
        assert aborted.ok
        result = await mine
        assert result.finish_reason is FinishReason.ABORT and len(result.token_ids) < 3000
        assert not any(task.done() for task in others)
        assert (await router.fleet.abort_all()).ok
        for task in others:
            assert (await task).finish_reason is FinishReason.ABORT


async def test_fan_out_control_reports_per_server_outcomes() -> None:
    async with fake_servers(2, token_latency_s=0.005) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        tensor = NamedTensor("w", "float32", (1000,), bytes(4000))
        updated = await router.fleet.update_weights([tensor], weight_version=3)
        assert updated.ok and {r.weight_version for r in updated.responses.values()} == {3}
        info = await router.fleet.server_info()
        assert {r.weight_version for r in info.responses.values()} == {3}
        assert (await router.fleet.pause(PauseMode.KEEP)).ok
        assert (await router.fleet.resume()).ok
        assert (await router.fleet.flush_cache()).ok
        # one server busy: Sleep fails there (FAILED_PRECONDITION) and succeeds on the other
        busy = asyncio.create_task(router.generate(GenerateCall("busy", [1, 2], params(3000))))
        await _until(lambda: sum(e.in_flight for e in router.fleet.servers.values()) == 1)
        busy_server = next(a for a, e in router.fleet.servers.items() if e.in_flight)
        while (await _server_load(busy_server)).running_requests == 0:
            await asyncio.sleep(0.01)
        slept = await router.fleet.sleep(1)
        assert len(slept.errors) == 1 and len(slept.responses) == 1
        (error,) = slept.errors.values()
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(InfrastructureError, match="1 of 2 failed"):
            slept.raise_for_errors()
        await router.fleet.abort_all()
        await busy
        assert (await router.fleet.wake_up()).ok


async def test_small_chunks_reassemble_on_every_server() -> None:
    config = FAST.model_copy(update={"weight_chunk_bytes": 1024})
    async with fake_servers(2) as servers, Router([address(s) for s in servers], config) as router:
        await router.fleet.wait_ready(2)
        tensors = [NamedTensor(f"t{i}", "float32", (700,), bytes(2800)) for i in range(3)]
        updated = await router.fleet.update_weights(tensors)
        assert updated.ok and {r.tensors_updated for r in updated.responses.values()} == {3}


async def test_generate_groups_tokens_into_few_messages_and_loses_nothing() -> None:
    sampling = params(100, temperature=0, top_logprobs=2)
    async with fake_servers(1) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        per_token = [e async for e in router.stream(GenerateCall("a", [5, 6, 7], sampling))]
        grouped = [
            e async for e in router.stream(GenerateCall("b", [5, 6, 7], sampling), min_chunk_tokens=32)
        ]
        final_only = [
            e async for e in router.stream(GenerateCall("c", [5, 6, 7], sampling), final_only=True)
        ]
        result = await router.generate(GenerateCall("d", [5, 6, 7], sampling))  # RouterConfig.generate_chunk_tokens: 32
    sizes = [len(e.token_ids) for e in grouped[:-1]]
    assert sum(sizes) == 100 and all(size >= 32 for size in sizes[:-1]) and len(sizes) <= 4  # last: the rest
    assert [len(e.token_ids) for e in final_only[:-1]] == [100]
    reference = per_token[-1]
    for outcome in (grouped[-1], final_only[-1], result):
        assert outcome.token_ids == reference.token_ids and len(reference.token_ids) == 100
        assert outcome.logprobs == reference.logprobs and outcome.top_logprobs == reference.top_logprobs
        assert outcome.weight_versions == reference.weight_versions


async def test_servers_added_and_removed_at_run_time() -> None:
    async with fake_servers(2) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready(1)
        await router.fleet.add_server(address(servers[1]))
        await router.fleet.wait_ready(2)
        removed = weakref.ref(router.fleet.servers[address(servers[0])])
        await router.fleet.remove_server(address(servers[0]))
        result = await router.generate(GenerateCall("after", [1, 2], params(3)))
        assert result.servers == (address(servers[1]),)
        gc.collect()
        assert removed() is None  # nothing keeps a removed server's endpoint (its in-flight gauge once did)
        assert router.metrics.registry.get_sample_value(
            "agentloop_router_in_flight", {"server": address(servers[0])}
        ) == 0


async def test_no_healthy_server_is_an_infrastructure_error() -> None:
    config = FAST.model_copy(update={"no_server_wait_s": 0.2})
    async with Router(["127.0.0.1:1"], config) as router:
        with pytest.raises(NoHealthyServerError):
            await router.generate(GenerateCall("x", [1], params(1)))


async def test_discovery_file_and_prometheus_exposition(tmp_path: Path) -> None:
    async with fake_servers(2) as servers:
        discovery = tmp_path / "servers.json"
        entries = [{"address": address(s), "dp_rank": i} for i, s in enumerate(servers)]
        discovery.write_text(json.dumps({"servers": entries}))
        async with Router.from_discovery_file(discovery, FAST) as router:
            await router.fleet.wait_ready(2)
            await router.generate(GenerateCall("m", [1, 2, 3], params(4)))
            text = generate_latest(router.metrics.registry).decode()
    for name in (
        "agentloop_router_in_flight",
        "agentloop_router_server_healthy",
        "agentloop_router_routing_decisions_total",
        "agentloop_router_generate_seconds_bucket",
        "agentloop_router_first_token_seconds_count",
    ):
        assert name in text
