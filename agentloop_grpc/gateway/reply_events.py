"""A streamed reply as one sequence of events, the same for every wire format: the streaming rules, written once.

The service yields TextDeltas as the turn decodes and then its ChatReply (or raises a GatewayError). ``reply_events``
turns that into, in order:

    Started                        the turn is under way (nothing is written before it: an error until then is the
                                   request's HTTP error, raised to the app)
    TextOpened                     before the first text (a reply with no text opens none)
    TextDelta*                     text as it decodes, and the rest of the reply's content when it is whole (what a
                                   turn offered tools held back until its calls were parsed); each token's logprobs
                                   ride on exactly one delta, or on a Logprobs event while no text is open
    TextClosed                     the text is whole (only after TextOpened)
    ToolCall*                      each call, whole, numbered as the reply's blocks (the text, when there is one, is
                                   block 0)
    Finished                       the reply
or, once Started, at any point:
    Failed                         the turn failed (a GatewayError), or its stream ended without a reply: the end

Each wire format is a ``StreamWriter`` that maps one event to its bytes (``sse_frames``), with no rules of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from .exchange import ChatReply, GatewayError, TextDelta, TokenLogprob

#: The error a stream that ends without its reply ends with (the gateway's fault: nothing the client can fix).
ENDED_WITHOUT_REPLY = "the turn's stream ended without a reply"


@dataclass(frozen=True, slots=True)
class Started:
    pass


@dataclass(frozen=True, slots=True)
class TextOpened:
    pass


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Logprobs of tokens that show no text while no text is open (a tool call being written)."""

    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True, slots=True)
class TextClosed:
    """The text is whole: the reply's ``content``, with all the turn's ``logprobs``."""

    reply: ChatReply


@dataclass(frozen=True, slots=True)
class ToolCall:
    #: The call's place among the reply's calls, and among its blocks (after the text block, when there is one).
    index: int
    block: int
    call: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Finished:
    reply: ChatReply
    #: Whether the stream had a text block (TextOpened), even if the reply's content came out empty.
    text_block: bool


@dataclass(frozen=True, slots=True)
class Failed:
    error: GatewayError


ReplyEvent = Started | TextOpened | TextDelta | Logprobs | TextClosed | ToolCall | Finished | Failed


class StreamWriter(Protocol):
    def write(self, event: ReplyEvent) -> bytes:
        """The event's server-sent event frames (b"": the format writes nothing for it)."""
        ...


async def reply_events(stream: AsyncIterator[TextDelta | ChatReply]) -> AsyncIterator[ReplyEvent]:
    items = aiter(stream)
    # 1. the first item before Started: an error raised now is the request's HTTP error
    first = await anext(items, None)
    if first is None:
        raise GatewayError(ENDED_WITHOUT_REPLY, status=502, kind="infrastructure")
    yield Started()
    # 2. text as it decodes
    opened, sent, logprobs_sent = False, "", 0
    reply = first if isinstance(first, ChatReply) else None
    item: TextDelta | ChatReply | None = first
    try:
        while isinstance(item, TextDelta):
            if item.text and not opened:
                opened = True
                yield TextOpened()
            if item.text or (opened and item.logprobs):
                yield item
            elif item.logprobs:
                yield Logprobs(item.logprobs)
            sent += item.text
            logprobs_sent += len(item.logprobs)
            item = await anext(items, None)
        reply = item
    except GatewayError as error:
        yield Failed(error)
        return
    if reply is None:
        yield Failed(GatewayError(ENDED_WITHOUT_REPLY, status=502, kind="infrastructure"))
        return
    # 3. the reply: the text it holds beyond what streamed (and the logprobs not yet told), its calls
    rest = reply.content[len(sent):] if reply.content.startswith(sent) else ""
    left = reply.logprobs[logprobs_sent:]
    if rest and not opened:
        opened = True
        yield TextOpened()
    if rest or (opened and left):
        yield TextDelta(rest, left)
    elif left:
        yield Logprobs(left)
    if opened:
        yield TextClosed(reply)
    for index, call in enumerate(reply.tool_calls):
        yield ToolCall(index, index + opened, call)
    yield Finished(reply, opened)


async def sse_frames(writer: StreamWriter,
                     stream: AsyncGenerator[TextDelta | ChatReply, None]) -> AsyncGenerator[bytes, None]:
    """The stream's frames as ``writer`` writes its events; a GatewayError before the turn starts is raised."""
    async with contextlib.aclosing(stream):  # a client that leaves ends the turn now, not when it is collected
        async for event in reply_events(stream):
            if frame := writer.write(event):
                yield frame
