"""Fake engine servers in child processes of their own, for the benchmarks that need many (router_scale.py,
routing_replay.py): the servers' CPU stays out of the measuring process, as engines run on devices of their own."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Iterator

from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig


def _serve(count: int, config_json: str, addresses: multiprocessing.Queue, stop) -> None:
    from agentloop_grpc.engine_adapters.factory import make_adapter
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    async def main() -> None:
        servers = []
        for _ in range(count):
            server = await create_server(make_adapter("fake", FakeEngineConfig.model_validate_json(config_json)))
            await start_adapter(server)
            servers.append(server)
        addresses.put([f"127.0.0.1:{s.port}" for s in servers])
        await asyncio.to_thread(stop.wait)
        await asyncio.gather(*(s.stop(1) for s in servers))

    asyncio.run(main())


@contextlib.contextmanager
def fake_servers(count: int, config: FakeEngineConfig,
                 per_process: int | None = None) -> Iterator[tuple[list[str], list[int]]]:
    """``count`` fake engine servers, ``per_process`` to a child process (None: all in one): their addresses and
    the child processes' ids."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    per_process = per_process or count
    started = []
    try:
        for first in range(0, count, per_process):
            queue = context.Queue()
            share = min(per_process, count - first)
            process = context.Process(target=_serve, args=(share, config.model_dump_json(), queue, stop), daemon=True)
            process.start()
            started.append((process, queue))
        yield [a for _, queue in started for a in queue.get(timeout=300)], [p.pid for p, _ in started if p.pid]
    finally:
        stop.set()
        for process, _ in started:
            process.join(30)
            if process.is_alive():
                process.kill()
