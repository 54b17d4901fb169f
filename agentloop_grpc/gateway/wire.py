"""WireFormat: what one HTTP API (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages) must provide so
the gateway serves it: its request read into a ChatRequest, a ChatReply written as its response, a stream written
as its server-sent events, and an error in its own error shape."""

from __future__ import annotations

from typing import Any, Protocol

from .config import GatewayLimits
from .exchange import ChatReply, ChatRequest, GatewayError
from .reply_events import StreamWriter


class WireFormat(Protocol):
    #: For metrics and logs: "chat_completions", "responses", "messages".
    name: str

    def parse(self, body: Any, limits: GatewayLimits) -> ChatRequest:
        """The request, or GatewayError naming the field at fault and the bound (``param`` set)."""
        ...

    def reply(self, reply: ChatReply) -> dict[str, Any]:
        """The non-streamed response body."""
        ...

    def writer(self, request: ChatRequest) -> StreamWriter:
        """What writes one streamed reply's events (reply_events.py) as the format's server-sent events, each one
        whole ``event:``/``data:`` frame ending in a blank line."""
        ...

    def error(self, error: GatewayError) -> dict[str, Any]:
        """The error body (the HTTP status is ``error.status``)."""
        ...


def sse(data: str, event: str | None = None) -> bytes:
    """One server-sent event frame."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()
