"""A server behind a slow link (a round trip longer than a GetLoad poll's 1 s timeout used to be) answers every
poll, late: it is not taken out of routing as a hung one, and its generations are not failed over. A hung server is
still taken out at the bound (test_liveness.py)."""

from __future__ import annotations

import time

import pytest

from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from tests.cluster.delay_proxy import Link, start

from .conftest import address, fake_servers
from .test_routing import params

pytestmark = pytest.mark.fault

LIVENESS_S = 2.0
#: Each way: a 1.5 s round trip, so every poll is answered 1.5 s after it is sent.
DELAY_S = 0.75


async def test_a_server_behind_a_slow_link_answers_polls_late_and_keeps_its_generations() -> None:
    link = Link()
    async with fake_servers(1, token_latency_s=0.01) as (server,):
        proxy = await start("127.0.0.1", address(server), link)
        slow = f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
        try:
            config = RouterConfig(load_poll_interval_s=0.1, liveness_timeout_s=LIVENESS_S)
            async with Router([slow], config) as router:
                await router.fleet.wait_ready(1, timeout_s=30)
                link.delay_s = DELAY_S
                began = time.monotonic()
                # a generation that lasts twice the liveness bound, polled all along
                result = await router.generate(GenerateCall("s", [1, 2, 3], params(450)))
                assert time.monotonic() - began > 2 * LIVENESS_S
                assert len(result.token_ids) == 450
                assert result.failovers == 0 and result.servers == (slow,)
                assert router.metrics.value("agentloop_router_servers_lost_total", server=slow) == 0
                assert router.fleet.servers[slow].healthy
        finally:
            proxy.close()
            await proxy.wait_closed()
