"""Failover with real server processes: SIGKILL one mid-stream; the generations finish elsewhere with nothing
lost or duplicated; a restarted server is used again."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentloop_grpc.common.types import FinishReason, SamplingParams
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from .conftest import ServerProcess, free_port, sampling_proto

pytestmark = pytest.mark.fault

FAST = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)
BUDGET = 300


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, ignore_eos=True, temperature=0, logprobs=True)


async def _direct(address: str, prompt: list[int], tokens: int) -> list[int]:
    """Generate on one server without the router (the fake engine is deterministic for greedy requests)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TokenGenerateStub(channel)
        request = generation_pb2.GenerateRequest(
            request_id="direct", prompt_ids=prompt, sampling_params=sampling_proto(greedy(tokens))
        )
        return [t async for m in stub.Generate(request, timeout=60) for t in m.chunk.token_ids]


async def stream_to_end(
    router: Router, session: str, prompt: list[int], received: dict[str, int], timeout_s: float | None = None,
    **options,
) -> GenerateResult:
    """Stream a greedy generation of BUDGET tokens to its result, counting in ``received`` the session's tokens."""
    async for event in router.stream(GenerateCall(session, prompt, greedy(BUDGET), timeout_s=timeout_s), **options):
        if isinstance(event, GenerateResult):
            return event
        received[session] = received.get(session, 0) + len(event.token_ids)
    raise AssertionError("no result")


async def assert_resumed(result: GenerateResult, prompt: list[int], survivor: str) -> None:
    """``result`` holds the first server's tokens for ``prompt`` (at least 20), then the next one's continuation of
    the prompt and those tokens: nothing lost, nothing twice (any server gives the same greedy tokens)."""
    reference = await _direct(survivor, prompt, BUDGET)
    split = next(i for i, (a, b) in enumerate(zip(result.token_ids, reference)) if a != b)
    assert split >= 20
    continuation = await _direct(survivor, prompt + list(result.token_ids[:split]), BUDGET - split)
    assert list(result.token_ids[split:]) == continuation


@pytest.mark.parametrize("min_chunk_tokens", [0, 8])  # every token as decoded; grouped (pending ones are lost)
async def test_sigkill_mid_stream_every_generation_completes_elsewhere(server_processes, min_chunk_tokens) -> None:
    server_processes.extend(ServerProcess(token_latency_ms=5) for _ in range(3))
    async with Router([p.address for p in server_processes], FAST) as router:
        await router.fleet.wait_ready(3)
        prompts = {f"traj{i}": [10 + i, 20 + i, 30 + i, 40 + i] for i in range(9)}
        received: dict[str, int] = {}
        tasks = {
            s: asyncio.create_task(stream_to_end(router, s, prompts[s], received, min_chunk_tokens=min_chunk_tokens))
            for s in prompts
        }
        while len(received) < len(prompts) or min(received.values()) < 20:
            await asyncio.sleep(0.01)
        victim = server_processes[0]
        on_victim = [s for s in prompts if router.session_server(s) == victim.address]
        assert on_victim, "sessions are spread over all servers"
        victim.kill()
        results = {s: await task for s, task in tasks.items()}

    survivor = server_processes[1].address
    for session, result in results.items():
        assert result.finish_reason is FinishReason.LENGTH
        assert len(result.token_ids) == len(result.logprobs) == len(result.weight_versions) == BUDGET
        if session not in on_victim:
            assert result.failovers == 0 and len(result.servers) == 1
            continue
        assert result.failovers == 1 and result.servers[0] == victim.address and len(result.servers) == 2
        await assert_resumed(result, prompts[session], survivor)


async def test_restarted_server_is_used_again(server_processes) -> None:
    port = free_port()
    server_processes.append(ServerProcess(port=port, token_latency_ms=1))
    server_processes.append(ServerProcess(token_latency_ms=1))
    restarted_address = server_processes[0].address
    async with Router([p.address for p in server_processes], FAST) as router:
        await router.fleet.wait_ready(2)
        server_processes[0].kill()
        for _ in range(200):
            if not router.fleet.servers[restarted_address].healthy:
                break
            await asyncio.sleep(0.02)
        assert not router.fleet.servers[restarted_address].healthy
        during = {(await router.generate(GenerateCall(f"a{i}", [1, 2, 3], greedy(2)))).servers[0] for i in range(8)}
        assert during == {server_processes[1].address}
        server_processes.append(ServerProcess(port=port, token_latency_ms=1))
        await router.fleet.wait_ready(2, timeout_s=20)
        after = set()
        for i in range(64):  # equal loads: a hash of the session breaks the tie, so it is used again soon
            after.add((await router.generate(GenerateCall(f"b{i}", [1, 2, 3], greedy(2)))).servers[0])
            if restarted_address in after:
                break
        assert restarted_address in after
