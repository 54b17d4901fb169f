"""The rollout side of the slow-link test, run in the head's namespace: ``python -m tests.cluster.slow_link_driver
DISCOVERY PROXY UPSTREAM SESSIONS SLOW_TOKENS STALL_TOKENS VOCAB``.

A Router over two servers: UPSTREAM reached through the delay proxy at PROXY (``delay_proxy.py``), the discovery
file's other server directly, with the file's TLS and tokens. It talks to the test on stdin/stdout, a line each way
per step:
  1. streams SESSIONS generations of SLOW_TOKENS tokens; prints ``streaming <placement>`` once every one has tokens;
     the test slows, stalls and flaps the proxied link meanwhile (below the Router's bounds) and says ``slowed``;
     the driver waits for every generation;
  2. streams SESSIONS generations of STALL_TOKENS tokens; prints ``streaming <placement>``; reads ``stalled <unix
     time>`` (the test stalled the link for good then), records when the Router took the proxied server out and
     when each of its generations got its next token from the other server, waits for every generation; prints
     ``finished``;
  3. reads ``released <unix time>`` (the stall ended then), records when the server is routed to again;
then checks every result against the fake engine's streams (``partition_driver._check``) and prints ``done <json>``.
The proxied server's health is watched throughout: every change, with its time, is in the JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateResult, Router, RouterConfig
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config
from agentloop_grpc.router.endpoint import Endpoint

from .partition_driver import _check, _stream


def _line(expected: str) -> float:
    word, at = sys.stdin.readline().split()
    assert word == expected, (word, expected)
    return float(at)


def _say(*words: object) -> None:
    print(*words, flush=True)


async def _watch(endpoint: Endpoint, changes: list[tuple[float, bool]]) -> None:
    """Every change of ``endpoint.healthy``, with its unix time."""
    healthy = endpoint.healthy
    while True:
        if endpoint.healthy != healthy:
            healthy = endpoint.healthy
            changes.append((time.time(), healthy))
        await asyncio.sleep(0.005)


class _Phase:
    """SESSIONS generations under way together, and what arrived when."""

    def __init__(self, router: Router, name: str, sessions: int, tokens: int) -> None:
        self.router, self.tokens = router, tokens
        self.prompts = {f"{name}{i}": [200 + i, 7, len(name), 7, 9 + i] for i in range(sessions)}
        self.arrivals: dict[str, list[tuple[float, int]]] = {s: [] for s in self.prompts}
        self.results: dict[str, GenerateResult] = {}
        self.tasks = [asyncio.create_task(_stream(router, s, p, tokens, self.arrivals[s], self.results))
                      for s, p in self.prompts.items()]
        self.placed: dict[str, str | None] = {}

    async def started(self) -> None:
        while not all(self.arrivals.values()):
            await asyncio.sleep(0.02)
        self.placed = {s: self.router.session_server(s) for s in self.prompts}
        _say("streaming", json.dumps(self.placed))

    async def finished(self) -> None:
        await asyncio.gather(*self.tasks)  # raises what a generation raised

    def longest_gap_s(self, session: str) -> float:
        times = [t for t, _ in self.arrivals[session]]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    async def report(self, reference: Router) -> dict:
        return {
            "placed": self.placed,
            "tokens": {s: len(r.token_ids) for s, r in self.results.items()},
            "servers": {s: list(r.servers) for s, r in self.results.items()},
            "failovers": {s: r.failovers for s, r in self.results.items()},
            "cut_at": {s: await _check(reference, self.results[s], p, self.tokens) for s, p in self.prompts.items()},
            "longest_gap_s": {s: self.longest_gap_s(s) for s in self.prompts},
        }


async def main(discovery: str, proxy: str, upstream: str, sessions: int, slow_tokens: int, stall_tokens: int,
               vocab_size: int) -> None:
    others = [a for a in discovery_addresses(discovery) if a != upstream]
    config = discovery_config(discovery, RouterConfig(placement="sticky_least_loaded"))
    async with Router([proxy, *others], config) as router:
        await router.fleet.wait_ready(min_servers=1 + len(others), timeout_s=30)
        slow = router.fleet.endpoint(proxy)
        changes: list[tuple[float, bool]] = []
        watcher = asyncio.create_task(_watch(slow, changes))
        # 1. below the bounds: latency, short stalls, flaps
        began = time.time()
        below = _Phase(router, "slow", sessions, slow_tokens)
        await below.started()
        await asyncio.to_thread(_line, "slowed")
        await below.finished()
        below_changes = [c for c in changes if c[0] >= began]
        # 2. a stall beyond them
        beyond = _Phase(router, "stall", sessions, stall_tokens)
        await beyond.started()
        stalled = await asyncio.to_thread(_line, "stalled")
        await beyond.finished()
        _say("finished")
        out = next((t for t, healthy in changes if t >= stalled and not healthy), None)
        resumed = {}  # each cut generation's first tokens after the server was taken out: the other server's
        for session, marks in beyond.arrivals.items():
            later = [t for t, _ in marks if out is not None and t > out]
            if beyond.placed[session] == proxy and later:
                resumed[session] = later[0] - stalled
        # 3. the stall ends: the server is routed to again
        released = await asyncio.to_thread(_line, "released")
        while not slow.healthy:
            await asyncio.sleep(0.01)
        back = time.time() - released
        watcher.cancel()
        engine = await create_server(FakeEngine(FakeEngineConfig(vocab_size=vocab_size)), "127.0.0.1:0")
        await start_adapter(engine)
        try:
            async with Router([f"127.0.0.1:{engine.port}"]) as reference:
                _say("done", json.dumps({
                    "below": {**await below.report(reference), "health_changes": below_changes},
                    "beyond": {**await beyond.report(reference), "detected_s": None if out is None else out - stalled,
                               "resumed_s": resumed},
                    "routed_to_again_s": back,
                }))
        finally:
            await engine.stop(grace_s=0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:8])))
