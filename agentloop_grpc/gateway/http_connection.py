"""GatewayConnection: uvicorn's HTTP/1.1 connection (its httptools protocol) with the bounds uvicorn lacks, so a
client that opens connections and sends slowly, or never, holds nothing for long.

A connection is in one phase at a time, each with its deadline (``GatewayLimits``):

- idle, from its opening or the end of a response to a request's first byte: ``idle_timeout_s``, then closed;
- head, from a request's first byte to the end of its headers: ``header_timeout_s``, then a 408 and closed;
- body, from the end of its headers to the end of its body: ``body_timeout_s``, then a 408 and closed;
- served, the body read: no deadline here (``generate_timeout_s`` bounds a turn).

A request's line and headers hold at most ``max_header_bytes`` (httptools itself keeps all it is sent), else a 431
and closed. Past ``max_connections`` open ones, a connection is closed as it is accepted. A request the parser refuses
(``content-length: -5``) and a timed-out one are answered in the route's own error JSON (``Refusal``), as the app
answers its own errors; the 408 of a body goes only to a request whose response has not started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .config import GatewayLimits
from .exchange import GatewayError

#: The route's error body for ``error``, from the request's path (``/sessions/s1/v1/messages``: Anthropic's shape).
Refusal = Callable[[str, GatewayError], bytes]

HEAD_TIMED_OUT = "the request's headers did not arrive within header_timeout_s={:g}"
BODY_TIMED_OUT = "the request's body did not arrive within body_timeout_s={:g}"
NOT_HTTP = "the request is not valid HTTP/1.1 ({})"
HEAD_TOO_LARGE = "the request's line and headers are more than max_header_bytes={}"


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop the parse: the 431 is already written."""


class GatewayConnection(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: GatewayLimits, refusal: Refusal, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.refusal = refusal
        self.url = b""  # uvicorn sets it at a request's first byte; a refusal before then reads it
        #: Bytes of the current request's line and headers so far.
        self.head_bytes = 0
        #: The deadline of the phase the connection is in (none while a request is served).
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.close()
            return
        self._arm(self.limits.idle_timeout_s, None)  # uvicorn's keep-alive timer starts only after a response

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_bytes = 0
        self._arm(self.limits.header_timeout_s, HEAD_TIMED_OUT.format(self.limits.header_timeout_s))

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > self.limits.max_header_bytes:
            self._disarm()
            self._refuse(GatewayError(HEAD_TOO_LARGE.format(self.limits.max_header_bytes), status=431,
                                      kind="too_large"))
            raise _HeadTooLarge  # the parser stops, and uvicorn's 400 finds the connection closing

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.pipeline:  # queued behind a request being served: uvicorn reads nothing more until it is answered
            self._disarm()
        else:
            self._arm(self.limits.body_timeout_s, BODY_TIMED_OUT.format(self.limits.body_timeout_s))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self._refuse(GatewayError(NOT_HTTP.format(msg.rstrip("."))))

    def _arm(self, seconds: float, timed_out: str | None) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._expired, timed_out)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self, timed_out: str | None) -> None:
        self.deadline = None
        if timed_out is None:
            self.transport.close()
        else:
            self._refuse(GatewayError(timed_out, status=408))

    def _refuse(self, error: GatewayError) -> None:
        """Answer ``error`` in the route's shape unless a response is under way, and close the connection."""
        if self.transport.is_closing():
            return
        cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None
        if cycle is None or not cycle.response_started:
            path = (self.url or b"").partition(b"?")[0].decode("latin-1")
            body = self.refusal(path, error)
            head = (f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\ncontent-type: application/json"
                    f"\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
            self.transport.write(head.encode("latin-1") + body)
        if cycle is not None:  # the app, waiting for the body, hears the client left and answers nobody
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()
