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
then checks every result against the fake engine's streams (``streams.check``) and prints ``done <json>``.
The proxied server's health is watched throughout: every change, with its time, is in the JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.router import Router, RouterConfig
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config
from agentloop_grpc.router.endpoint import Endpoint

from .streams import Streams, read_line, reference_router, say


async def _watch(endpoint: Endpoint, changes: list[tuple[float, bool]]) -> None:
    """Every change of ``endpoint.healthy``, with its unix time."""
    healthy = endpoint.healthy
    while True:
        if endpoint.healthy != healthy:
            healthy = endpoint.healthy
            changes.append((time.time(), healthy))
        await asyncio.sleep(0.005)


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
        below = Streams(router, "slow", sessions, slow_tokens)
        await below.started()
        await asyncio.to_thread(read_line, "slowed")
        await below.finished()
        below_changes = [c for c in changes if c[0] >= began]
        # 2. a stall beyond them
        beyond = Streams(router, "stall", sessions, stall_tokens)
        await beyond.started()
        stalled = await asyncio.to_thread(read_line, "stalled")
        await beyond.finished()
        say("finished")
        out = next((t for t, healthy in changes if t >= stalled and not healthy), None)
        resumed = beyond.resumed(proxy, out, stalled)  # the cut generations' first tokens from the other server
        # 3. the stall ends: the server is routed to again
        released = await asyncio.to_thread(read_line, "released")
        while not slow.healthy:
            await asyncio.sleep(0.01)
        back = time.time() - released
        watcher.cancel()
        async with reference_router(vocab_size) as reference:
            say("done", json.dumps({
                "below": {**await below.report(reference), "health_changes": below_changes},
                "beyond": {**await beyond.report(reference), "detected_s": None if out is None else out - stalled,
                           "resumed_s": resumed},
                "routed_to_again_s": back,
            }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:8])))
