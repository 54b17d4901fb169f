"""The rollout side of the partition test, run in the head's namespace: ``python -m tests.cluster.partition_driver
DISCOVERY PARTITIONED_ADDRESS SESSIONS TOKENS VOCAB``.

It talks to the test on stdin/stdout, one line each way per step:
  1. streams SESSIONS generations of TOKENS tokens through a Router built from the discovery file, half of them
     on the server to be partitioned; prints ``streaming`` once every one has tokens;
  2. reads ``partitioned <unix time>`` (the test took the link down then), records when the Router took that server
     out and when each of its generations got its next token from elsewhere, waits for every generation, checks
     each against the fake engine's streams (``streams.check``); prints ``done <json>``;
  3. reads ``healed <unix time>``, records when the server is routed to again, places new sessions until one lands
     there; prints ``rejoined <json>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.router import Router, RouterConfig

from .streams import Streams, new_session_on, read_line, reference_router, say


async def main(discovery: str, cut_address: str, sessions: int, tokens: int, vocab_size: int) -> None:
    config = RouterConfig(placement="sticky_least_loaded")
    async with Router.from_discovery_file(discovery, config) as router:
        await router.fleet.wait_ready(min_servers=len(router.fleet.servers), timeout_s=30)
        cut = router.fleet.endpoint(cut_address)
        # 1. every generation under way
        streams = Streams(router, "s", sessions, tokens, first=100)
        await streams.started()
        # 2. the partition: detection, resumption, completion
        partitioned = read_line("partitioned")
        detected = await streams.finished(watched=cut)
        async with reference_router(vocab_size) as reference:
            report = await streams.report(reference)
        say("done", json.dumps({
            **report,
            "detected_s": None if detected is None else detected - partitioned,
            "resumed_s": streams.resumed(cut_address, detected, partitioned),
        }))
        # 3. the heal: the server rejoins and takes new sessions
        healed = read_line("healed")
        while not cut.healthy:
            await asyncio.sleep(0.02)
        rejoined = time.time() - healed
        landed, tried = await new_session_on(router, cut_address)
        say("rejoined", json.dumps({"rejoined_s": rejoined, "new_session_on_it": landed, "tried": tried}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
