"""generate() takes the unary GenerateUnary RPC when the whole budget fits one grouped message, and the unary path
keeps every guarantee of the streamed one: same result, cancellation and deadlines abort in the engine, a server
killed mid-call is replaced (the call starts again elsewhere: nothing had arrived)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentloop_grpc.common.types import FinishReason
from agentloop_grpc.router import GenerateCall, InfrastructureError, Router
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from .conftest import ServerProcess, address, fake_servers, sampling_proto
from .test_routing import FAST, _until, _wait_idle, params


def _attempts(router: Router, rpc: str) -> float:
    return router.metrics.value("agentloop_router_generate_attempts_total", rpc=rpc)


async def test_generate_takes_the_unary_rpc_when_the_budget_fits_one_message() -> None:
    sampling = params(8, temperature=0, top_logprobs=2, logprobs=True)
    async with fake_servers(1) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        streamed = [e async for e in router.stream(GenerateCall("a", [5, 6, 7], sampling))][-1]
        assert (_attempts(router, "stream"), _attempts(router, "unary")) == (1, 0)
        unary = await router.generate(GenerateCall("b", [5, 6, 7], sampling))  # 8 <= generate_chunk_tokens (32)
        assert (_attempts(router, "stream"), _attempts(router, "unary")) == (1, 1)
        assert unary.token_ids == streamed.token_ids and len(unary.token_ids) == 8
        assert unary.logprobs == streamed.logprobs and unary.top_logprobs == streamed.top_logprobs
        assert unary.weight_versions == streamed.weight_versions
        assert unary.finish_reason is FinishReason.LENGTH and unary.prompt_tokens == 3
        await router.generate(GenerateCall("c", [5, 6, 7], params(33)))  # more than one message's worth: streamed
        _ = [e async for e in router.stream(GenerateCall("d", [5, 6, 7], sampling), final_only=True)]  # a stream
        await router.generate(GenerateCall("e", [5, 6, 7]))  # no budget given (the server's defaults)
        assert (_attempts(router, "stream"), _attempts(router, "unary")) == (4, 1)
    config = FAST.model_copy(update={"unary_generate": False})
    async with fake_servers(1) as servers, Router([address(servers[0])], config) as router:
        await router.fleet.wait_ready()
        again = await router.generate(GenerateCall("b", [5, 6, 7], sampling))
        assert (_attempts(router, "stream"), _attempts(router, "unary")) == (1, 0)
        assert again.token_ids == streamed.token_ids


async def test_cancelling_a_unary_generate_aborts_in_the_engine() -> None:
    async with fake_servers(1, token_latency_s=0.2) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        task = asyncio.create_task(router.generate(GenerateCall("c", [1, 2, 3], params(30))))  # ~6 s
        await _until(lambda: servers[0].lifecycle.load().running_requests == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        load = await _wait_idle(address(servers[0]))
        assert (load.running_requests, load.waiting_requests) == (0, 0)
        assert _attempts(router, "unary") == 1


async def test_a_unary_generate_past_its_deadline_frees_the_engine() -> None:
    async with fake_servers(1, token_latency_s=0.2) as servers, Router([address(servers[0])], FAST) as router:
        await router.fleet.wait_ready()
        with pytest.raises(InfrastructureError, match="deadline"):
            await router.generate(GenerateCall("d", [1, 2, 3], params(30), timeout_s=0.3))
        load = await _wait_idle(address(servers[0]))
        assert (load.running_requests, load.waiting_requests) == (0, 0)


async def test_sigkill_mid_unary_generate_completes_elsewhere(server_processes) -> None:
    server_processes.extend(ServerProcess(token_latency_ms=100) for _ in range(3))  # 30 tokens: ~3 s per call
    async with Router([p.address for p in server_processes], FAST) as router:
        await router.fleet.wait_ready(3)
        prompts = {f"traj{i}": [10 + i, 20 + i, 30 + i] for i in range(9)}
        greedy = params(30, temperature=0, logprobs=True)
        calls = [GenerateCall(s, prompt, greedy) for s, prompt in prompts.items()]
        tasks = {call.session_id: asyncio.create_task(router.generate(call)) for call in calls}
        await _until(lambda: all(e.in_flight for e in router.fleet.servers.values()))
        victim = server_processes[0]
        on_victim = [s for s in prompts if router.session_server(s) == victim.address]
        assert on_victim, "sessions are spread over all servers"
        await asyncio.sleep(0.5)  # the victim is decoding them
        victim.kill()
        results = {s: await task for s, task in tasks.items()}
        assert _attempts(router, "stream") == 0
        assert router.metrics.value("agentloop_router_retries_total", code="UNAVAILABLE") >= 1

    survivor = server_processes[1].address
    async with grpc.aio.insecure_channel(survivor) as channel:
        stub = generation_pb2_grpc.TokenGenerateStub(channel)
        for session, result in results.items():
            assert result.finish_reason is FinishReason.LENGTH
            assert len(result.token_ids) == len(result.logprobs) == len(result.weight_versions) == 30
            assert result.failovers == 0  # nothing had arrived: the call started again, no tokens to resume from
            if session not in on_victim:
                assert len(result.servers) == 1
                continue
            assert result.servers[0] == victim.address and len(result.servers) == 2
            request = generation_pb2.GenerateRequest(
                request_id=f"direct-{session}", prompt_ids=prompts[session], sampling_params=sampling_proto(greedy)
            )
            direct = await stub.GenerateUnary(generation_pb2.GenerateUnaryRequest(request=request), timeout=60)
            assert result.token_ids == tuple(direct.complete.tokens.token_ids)  # the whole generation, once
