"""The rollout side of the node-loss test, run in the head's namespace: ``python -m tests.cluster.node_loss_driver
DISCOVERY OTHER_ADDRESS SESSIONS TOKENS VOCAB``.

A Router over the server of DISCOVERY (the launcher under test: one server, on the node to be killed) and
OTHER_ADDRESS (a server elsewhere, reached with the same TLS and token), following DISCOVERY. One line each way per
step with the test:
  1. streams SESSIONS generations of TOKENS tokens, some on each server; prints ``streaming <placed>``;
  2. reads ``killed <unix time>``: records when the Router took the killed server out and when its generations got
     their next token from the other server, waits for all, checks each against the fake engine's streams (the
     first server's tokens up to the cut, then the other's continuation); prints ``done <json>``;
  3. waits until the discovery file names a new server (the launcher restarted it) and the Router routes to it,
     places new sessions until one lands there; prints ``rejoined <json>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config
from agentloop_grpc.router.follow import following_discovery_file

from .partition_driver import _check, _line, _say, _stream


async def main(discovery: str, other: str, sessions: int, tokens: int, vocab_size: int) -> None:
    (doomed,) = discovery_addresses(discovery)
    config = discovery_config(discovery, RouterConfig(placement="sticky_least_loaded"))
    async with Router([doomed, other], config) as router, \
            following_discovery_file(router.fleet, discovery, interval_s=0.2):
        await router.fleet.wait_ready(min_servers=2, timeout_s=30)
        cut = router.fleet.endpoint(doomed)
        prompts = {f"s{i}": [200 + i, 7, 7, 7, 9 + i] for i in range(sessions)}
        arrivals: dict[str, list[tuple[float, int]]] = {s: [] for s in prompts}
        results: dict[str, GenerateResult] = {}
        tasks = [asyncio.create_task(_stream(router, s, p, tokens, arrivals[s], results)) for s, p in prompts.items()]
        # 1. every generation under way
        while not all(arrivals.values()):
            await asyncio.sleep(0.02)
        placed = {s: router.session_server(s) for s in prompts}
        _say("streaming", json.dumps(placed))
        # 2. the node killed: detection, resumption, completion
        word, at = _line().split()
        assert word == "killed", word
        killed = float(at)
        detected = None
        while not all(t.done() for t in tasks):
            if detected is None and not cut.healthy:
                detected = time.time()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)  # raises what a generation raised
        resumed = {}
        for session, marks in arrivals.items():
            later = [t for t, _ in marks if detected is not None and t > detected]
            if placed[session] == doomed and later:
                resumed[session] = later[0] - killed
        engine = await create_server(FakeEngine(FakeEngineConfig(vocab_size=vocab_size)), "127.0.0.1:0")
        await start_adapter(engine)
        try:
            async with Router([f"127.0.0.1:{engine.port}"]) as reference:
                cuts = {s: await _check(reference, results[s], prompts[s], tokens) for s in prompts}
        finally:
            await engine.stop(grace_s=0.1)
        _say("done", json.dumps({
            "detected_s": None if detected is None else detected - killed,
            "resumed_s": resumed,
            "tokens": {s: len(r.token_ids) for s, r in results.items()},
            "servers": {s: list(r.servers) for s, r in results.items()},
            "cut_at": cuts,
        }))
        # 3. the restarted server: in the discovery file, added by the follower, routed to
        while True:
            new = [a for a in router.fleet.servers if a not in (doomed, other)]
            if new and router.fleet.endpoint(new[0]).healthy and new[0] not in router.fleet.held_out:
                break
            await asyncio.sleep(0.05)
        routed = time.time() - killed
        landed, tried = None, 0
        while landed is None and tried < 64:
            batch = await asyncio.gather(*(
                router.generate(GenerateCall(f"new{tried + i}", [5, 6, 7], SamplingParams(max_new_tokens=4)))
                for i in range(4)))
            tried += 4
            landed = next((r.session_id for r in batch if r.servers == (new[0],)), None)
        _say("rejoined", json.dumps({"address": new[0], "routed_s": routed, "new_session_on_it": landed,
                                     "fleet": sorted(router.fleet.servers)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
