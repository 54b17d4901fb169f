"""The rollout side of the node-loss test, run in the head's namespace: ``python -m tests.cluster.node_loss_driver
DISCOVERY OTHER_ADDRESS SESSIONS TOKENS VOCAB``.

A Router over the server of DISCOVERY (the launcher under test: one server, on the node to be killed) and
OTHER_ADDRESS (a server elsewhere, reached with the same TLS and token), following DISCOVERY. One line each way per
step with the test:
  1. streams SESSIONS generations of TOKENS tokens, some on each server; prints ``streaming <placed>``;
  2. reads ``killed <unix time>``: records when the Router took the killed server out and when its generations got
     their next token from the other server, waits for all, checks each against the fake engine's streams
     (``streams.check``); prints ``done <json>``;
  3. waits until the discovery file names a new server (the launcher restarted it) and the Router routes to it,
     places new sessions until one lands there; prints ``rejoined <json>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.router import Router, RouterConfig
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config
from agentloop_grpc.router.follow import following_discovery_file

from .streams import Streams, new_session_on, read_line, reference_router, say


async def main(discovery: str, other: str, sessions: int, tokens: int, vocab_size: int) -> None:
    (doomed,) = discovery_addresses(discovery)
    config = discovery_config(discovery, RouterConfig(placement="sticky_least_loaded"))
    async with Router([doomed, other], config) as router, \
            following_discovery_file(router.fleet, discovery, interval_s=0.2):
        await router.fleet.wait_ready(min_servers=2, timeout_s=30)
        # 1. every generation under way
        streams = Streams(router, "s", sessions, tokens)
        await streams.started()
        # 2. the node killed: detection, resumption, completion
        killed = read_line("killed")
        detected = await streams.finished(watched=router.fleet.endpoint(doomed))
        async with reference_router(vocab_size) as reference:
            report = await streams.report(reference)
        say("done", json.dumps({
            **report,
            "detected_s": None if detected is None else detected - killed,
            "resumed_s": streams.resumed(doomed, detected, killed),
        }))
        # 3. the restarted server: in the discovery file, added by the follower, routed to
        while True:
            new = [a for a in router.fleet.servers if a not in (doomed, other)]
            if new and router.fleet.endpoint(new[0]).healthy and new[0] not in router.fleet.held_out:
                break
            await asyncio.sleep(0.05)
        routed = time.time() - killed
        landed, _ = await new_session_on(router, new[0])
        say("rejoined", json.dumps({"address": new[0], "routed_s": routed, "new_session_on_it": landed,
                                    "fleet": sorted(router.fleet.servers)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
