"""A hung server (issue 18, fault 3): a stopped process (SIGSTOP: the kernel still holds its connections, nothing
answers on them) or a wedged event loop (gRPC's threads still answer pings, no handler runs). Its in-flight
generations fail over and resume elsewhere well within their deadline with every token kept, the Router reports
it down, and once it answers again (SIGCONT, the loop freed) it is routed to again."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig

from .conftest import ServerProcess
from .test_failover import BUDGET, assert_resumed, stream_to_end
from .test_routing import _until, params

pytestmark = pytest.mark.fault

WEDGEABLE = (sys.executable, str(Path(__file__).with_name("wedgeable_engine.py")))
#: Each generation's deadline: without liveness checks, a hung server held its generations this long.
DEADLINE_S = 300.0
#: How long the test waits for the generations after the hang: far less than their deadline.
HANG_LIMIT_S = 60.0
PROMPTS = {f"traj{i}": [10 + i, 20 + i, 30 + i, 40 + i] for i in range(8)}


def _config(liveness_timeout_s: float) -> RouterConfig:
    return RouterConfig(
        load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01,
        liveness_timeout_s=liveness_timeout_s,
    )


def _lost(router: Router, server: str) -> float:
    return router.metrics.value("agentloop_router_servers_lost_total", server=server)


async def _hang_mid_generation(
    router: Router, victim: ServerProcess, hang: signal.Signals
) -> tuple[dict[str, GenerateResult], list[str], float]:
    """Stream every session; once each has 20 tokens, send ``hang`` to the victim. Returns the results, the
    sessions that were on the victim, and the seconds from the hang to the last result."""
    received: dict[str, int] = {}
    tasks = {
        s: asyncio.create_task(stream_to_end(router, s, prompt, received, timeout_s=DEADLINE_S))
        for s, prompt in PROMPTS.items()
    }
    await _until(lambda: len(received) == len(PROMPTS) and min(received.values()) >= 20)
    on_victim = [s for s in PROMPTS if router.session_server(s) == victim.address]
    assert on_victim, "sessions are spread over both servers"
    victim.process.send_signal(hang)
    hung_at = time.monotonic()
    _, pending = await asyncio.wait(tasks.values(), timeout=HANG_LIMIT_S)
    for task in pending:
        task.cancel()
    assert not pending, f"{len(pending)} generations still wait on the hung server after {HANG_LIMIT_S} s"
    return {s: task.result() for s, task in tasks.items()}, on_victim, time.monotonic() - hung_at


async def _every_token_kept(
    results: dict[str, GenerateResult], on_victim: list[str], victim: str, survivor: str
) -> None:
    for session, result in results.items():
        assert len(result.token_ids) == len(result.logprobs) == len(result.weight_versions) == BUDGET
        if session not in on_victim:
            assert result.failovers == 0 and result.servers == (survivor,)
            continue
        assert result.failovers == 1 and result.servers == (victim, survivor)
        await assert_resumed(result, PROMPTS[session], survivor)


async def _routed_to_again(router: Router, server: str) -> bool:
    """Whether new sessions reach ``server`` again. They go to the least-loaded server: first wait until the Router
    sees ``server`` no more loaded than the others, since a load report that counted other clients' requests there
    stands until its next poll (one idle_load_poll_interval_s later for a server carrying none of ours)."""
    servers = router.fleet.servers
    await _until(lambda: servers[server].load <= min(e.load for e in servers.values() if e.healthy))
    for i in range(64):  # equal loads: a hash of the session breaks the tie, so it is chosen soon
        if (await router.generate(GenerateCall(f"after{i}", [1, 2, 3], params(2)))).servers[0] == server:
            return True
    return False


async def test_a_stopped_server_is_found_by_keepalive_and_its_generations_resume_elsewhere(server_processes):
    server_processes.extend(ServerProcess(token_latency_ms=5) for _ in range(2))
    victim, survivor = server_processes
    # GetLoad timeouts would take out the server only after the test stops waiting: keepalive must find it
    async with Router([p.address for p in server_processes], _config(liveness_timeout_s=10 * HANG_LIMIT_S)) as router:
        await router.fleet.wait_ready(2)
        results, on_victim, seconds = await _hang_mid_generation(router, victim, signal.SIGSTOP)
        print(f"SIGSTOP: {len(on_victim)} generations resumed elsewhere {seconds:.1f} s after the stop")
        assert not router.fleet.servers[victim.address].healthy
        assert router.metrics.value("agentloop_router_server_healthy", server=victim.address) == 0
        assert _lost(router, victim.address) == 0  # the channel's pings found it, not GetLoad
        await _every_token_kept(results, on_victim, victim.address, survivor.address)

        victim.process.send_signal(signal.SIGCONT)
        await _until(lambda: router.fleet.servers[victim.address].healthy, timeout_s=HANG_LIMIT_S)
        assert await _routed_to_again(router, victim.address)


async def test_a_wedged_server_is_taken_out_by_getload_timeouts_and_comes_back(server_processes):
    server_processes.append(ServerProcess(token_latency_ms=5, program=WEDGEABLE))
    server_processes.append(ServerProcess(token_latency_ms=5))
    victim, survivor = server_processes
    async with Router([p.address for p in server_processes], _config(liveness_timeout_s=2)) as router:
        await router.fleet.wait_ready(2)
        results, on_victim, seconds = await _hang_mid_generation(router, victim, signal.SIGUSR1)
        print(f"wedged: {len(on_victim)} generations resumed elsewhere {seconds:.1f} s after the wedge")
        assert not router.fleet.servers[victim.address].healthy
        assert _lost(router, victim.address) == 1
        await _every_token_kept(results, on_victim, victim.address, survivor.address)

        victim.process.send_signal(signal.SIGUSR2)
        await _until(lambda: router.fleet.servers[victim.address].healthy, timeout_s=HANG_LIMIT_S)
        assert await _routed_to_again(router, victim.address)


async def test_a_wedged_server_mid_unary_generate_is_replaced(server_processes):
    server_processes.append(ServerProcess(token_latency_ms=100, program=WEDGEABLE))  # 30 tokens: ~3 s per call
    server_processes.append(ServerProcess(token_latency_ms=1))
    victim = server_processes[0]
    async with Router([p.address for p in server_processes], _config(liveness_timeout_s=2)) as router:
        await router.fleet.wait_ready(2)
        # the four calls spread over both servers (least loaded first)
        calls = [
            asyncio.create_task(router.generate(GenerateCall(f"u{i}", [5, 6, i], params(30), timeout_s=DEADLINE_S)))
            for i in range(4)
        ]
        await _until(lambda: router.fleet.servers[victim.address].in_flight > 0)
        on_victim = [f"u{i}" for i in range(4) if router.session_server(f"u{i}") == victim.address]
        assert on_victim
        await asyncio.sleep(0.5)  # the victim is decoding them
        victim.process.send_signal(signal.SIGUSR1)
        _, pending = await asyncio.wait(calls, timeout=HANG_LIMIT_S)
        for task in pending:
            task.cancel()
        assert not pending, f"{len(pending)} unary generations still wait on the wedged server"
        for call in calls:
            result = call.result()
            assert len(result.token_ids) == 30 and result.failovers == 0  # nothing had arrived: started again
        assert {call.result().session_id for call in calls if victim.address in call.result().servers} == set(on_victim)
        assert _lost(router, victim.address) == 1
        victim.process.send_signal(signal.SIGUSR2)
