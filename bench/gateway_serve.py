"""The session gateway in its own process, for bench/gateway.py: a Router over the given engine servers and the
gateway's HTTP app on a loopback port. The peer gateway it is compared with runs in its own process, so ours does
too (the benchmark's clients do not share our event loop). Prints ``listening on <url>`` once the engines are
ready; SIGTERM or SIGINT stops it.

Usage: python bench/gateway_serve.py ENGINE_ADDRESS [ENGINE_ADDRESS ...]
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import Router

ENGINE_READY_TIMEOUT_S = 600.0  # vLLM on a busy 2-core machine


async def main(engines: list[str]) -> None:
    codec = load_codec(None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Router(engines) as router:
        await router.fleet.wait_ready(timeout_s=ENGINE_READY_TIMEOUT_S)
        async with serve_app(create_app(SessionGateway(router, codec, GatewayConfig()))) as url:
            print(f"listening on {url}", flush=True)
            await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
