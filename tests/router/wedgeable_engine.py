"""A fake engine server whose event loop a test can wedge, as a stuck handler or a blocking call would.

SIGUSR1 blocks the server's event loop until SIGUSR2: no handler runs (GetLoad, Health and Generate stop
answering), while gRPC's own threads keep the connection up and answer HTTP/2 pings, so keepalive cannot see it.
Takes `agentloop engine serve`'s options for the fake adapter and prints the same first line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time

from agentloop_grpc.engine_adapters.config_flags import apply_setting
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import serve

_released = False


def _wedge() -> None:
    global _released
    _released = False
    while not _released:  # the SIGUSR2 handler runs between these sleeps, in this same thread
        time.sleep(0.01)


def _release(signum: int, frame: object) -> None:
    global _released
    _released = True


async def _main(port: int, settings: list[str]) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _wedge)
    signal.signal(signal.SIGUSR2, _release)
    fields: dict = {}
    for setting in settings:
        apply_setting(fields, setting)
    engine = make_adapter("fake", fields)

    def announce(bound: int) -> None:
        print(f"agentloop engine listening on 127.0.0.1:{bound} (adapter fake)", flush=True)

    await serve(engine, f"127.0.0.1:{port}", drain_timeout_s=1, on_listening=announce)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", choices=["fake"], default="fake")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], dest="settings")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level)
    asyncio.run(_main(args.port, args.settings))
