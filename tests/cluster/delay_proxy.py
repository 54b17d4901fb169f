"""A TCP proxy that slows, stalls or flaps a link, for kernels without netem (``tc qdisc add ... netem``): run in a
node, ``python -m tests.cluster.delay_proxy LISTEN_HOST UPSTREAM_HOST:PORT``, it forwards every connection made to it
to the upstream server, byte for byte (TLS passes through untouched: a client checks the certificate against the
proxy's address, which the cluster's certificate names, since it names every node).

It prints ``listening on HOST:PORT`` once bound, then reads commands on stdin, one a line, and answers each with
``ok <unix time> <command>`` once applied (``stats`` with a JSON line instead):

    delay S          from now on, every byte is forwarded S seconds after it was read, each way (S 0: no delay)
    stall S          nothing is forwarded either way for S seconds from now; what is read meanwhile waits, in order
                     (a link that stalls, not one that loses: TCP acknowledges the bytes, so only HTTP/2 pings and
                     the callers' own deadlines can notice)
    flap DOWN UP N   N times: stalled DOWN seconds, then UP seconds forwarding (the first stall begins now)
    release          end a stall now
    stats            {"accepted": connections accepted, "open": open now, "up": bytes to upstream, "down": bytes back}

``start`` runs it in a test's own event loop instead, obeying a ``Link`` the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time


class Link:
    """What every connection of the proxy obeys (one link between the clients and the upstream server)."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.held_until = 0.0  # time.monotonic(): nothing is forwarded before it
        self.accepted = 0
        self.open = 0
        self.bytes = {"up": 0, "down": 0}

    def stall(self, seconds: float) -> None:
        self.held_until = max(self.held_until, time.monotonic() + seconds)

    def stats(self) -> dict[str, int]:
        return {"accepted": self.accepted, "open": self.open, **self.bytes}


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link, direction: str) -> None:
    """Forward one direction: each chunk as read, once its delay has passed and the link is not held."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def read() -> None:
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + link.delay_s, data))
        finally:
            queue.put_nowait(None)

    reading = asyncio.create_task(read())
    try:
        while (item := await queue.get()) is not None:
            due, data = item
            # a stall that began after the chunk was read holds it too; short sleeps, so that a release frees it
            while (wait := max(due, link.held_until) - time.monotonic()) > 0:
                await asyncio.sleep(min(wait, 0.01))
            writer.write(data)
            await writer.drain()
            link.bytes[direction] += len(data)
        if writer.can_write_eof():
            writer.write_eof()
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await reading


async def _serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, link: Link,
                 upstream: tuple[str, int]) -> None:
    link.accepted += 1
    link.open += 1
    server_writer = None
    try:
        server_reader, server_writer = await asyncio.open_connection(*upstream)
        pumps = [asyncio.create_task(_pump(client_reader, server_writer, link, "up")),
                 asyncio.create_task(_pump(server_reader, client_writer, link, "down"))]
        # one side failing (a reset) ends both; a clean end of one direction lets the other finish
        _done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    except (OSError, asyncio.CancelledError):  # a reset; or the proxy's own end, which closes every connection
        pass
    finally:
        link.open -= 1
        for writer in (client_writer, server_writer):
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


async def _flap(link: Link, down_s: float, up_s: float, times: int) -> None:
    for _ in range(times):
        link.stall(down_s)
        await asyncio.sleep(down_s + up_s)


async def start(listen_host: str, upstream: str, link: Link) -> asyncio.Server:
    """The proxy in the running event loop (a test's own), on a free port of ``listen_host``, obeying ``link``."""
    host, _, port = upstream.rpartition(":")
    return await asyncio.start_server(lambda r, w: _serve(r, w, link, (host, int(port))), listen_host, 0)


async def main(listen_host: str, upstream: str) -> None:
    link = Link()
    server = await start(listen_host, upstream, link)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    flaps: set[asyncio.Task] = set()
    while line := await asyncio.to_thread(sys.stdin.readline):
        words = line.split()
        if not words:
            continue
        command, args = words[0], [float(w) for w in words[1:]]
        if command == "delay":
            link.delay_s = args[0]
        elif command == "stall":
            link.stall(args[0])
        elif command == "release":
            link.held_until = 0.0
        elif command == "flap":
            task = asyncio.create_task(_flap(link, args[0], args[1], int(args[2])))
            flaps.add(task)  # held: a task nobody references may be collected
            task.add_done_callback(flaps.discard)
        elif command == "stats":
            print(json.dumps(link.stats()), flush=True)
            continue
        else:
            print(f"error unknown command {command}", flush=True)
            continue
        print(f"ok {time.time()} {line.strip()}", flush=True)
    server.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
