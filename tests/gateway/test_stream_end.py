"""A stream that ends without its reply ends, in every API, with that API's own error event (reply_events.py), read
by the real openai and anthropic SDKs over the real app: OpenAI Chat's error object (the SDK raises APIError),
Responses' ``error`` then ``response.failed``, Anthropic's ``event: error`` (the SDK raises APIStatusError). The three
formats once differed here: a silent ``[DONE]``, an ``error`` event with no terminal response, a dropped connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

import anthropic
import openai
import pytest

from agentloop_grpc.gateway.exchange import ChatReply, ChatRequest, TextDelta
from agentloop_grpc.gateway.reply_events import ENDED_WITHOUT_REPLY
from agentloop_grpc.gateway.service import SessionGateway

from .conftest import scripted_gateway

QUESTION = [{"role": "user", "content": "Say hello."}]


class ReplyLost(SessionGateway):
    """Its turn streams the text and then ends without the ChatReply (the case a gateway bug, or a turn cut short
    inside the service, leaves the app with)."""

    async def chat_stream(self, session_id: str,
                          request: ChatRequest) -> AsyncGenerator[TextDelta | ChatReply, None]:
        async with contextlib.aclosing(super().chat_stream(session_id, request)) as events:
            async for event in events:
                if isinstance(event, ChatReply):
                    return
                yield event


async def test_each_api_ends_a_stream_without_its_reply_with_its_error_event(codec):
    async with scripted_gateway(codec, ["Hello there, friend."] * 3, gateway_class=ReplyLost) as g:
        # OpenAI Chat Completions: the text, then the error object, which the SDK raises
        chat = await g.openai("chat", max_retries=0).chat.completions.create(
            model="m", messages=QUESTION, stream=True)
        text = []
        with pytest.raises(openai.APIError, match=ENDED_WITHOUT_REPLY):
            async for chunk in chat:
                text += [choice.delta.content or "" for choice in chunk.choices]
        assert "".join(text) == "Hello there, friend."

        # OpenAI Responses: an error event, then response.failed ends the response
        responses = await g.openai("responses", max_retries=0).responses.create(model="m", input="Say hello.",
                                                                               stream=True)
        events = [event async for event in responses]
        assert [event.type for event in events][-2:] == ["error", "response.failed"]
        error, failed = events[-2], events[-1]
        assert error.type == "error" and error.message == ENDED_WITHOUT_REPLY
        assert failed.type == "response.failed" and failed.response.status == "failed"
        assert failed.response.error is not None and failed.response.error.message == ENDED_WITHOUT_REPLY
        assert failed.response.id == events[0].response.id

        # Anthropic Messages: event: error, which the SDK raises
        client = g.anthropic("messages", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match=ENDED_WITHOUT_REPLY) as raised:
            async with client.messages.stream(model="m", max_tokens=64, messages=QUESTION) as stream:
                await stream.until_done()
        assert raised.value.body == {"type": "error", "error": {"type": "api_error", "message": ENDED_WITHOUT_REPLY}}
        # none of the three left its session a request in flight
        assert [g.gateway.sessions.get(s).in_flight for s in ("chat", "responses", "messages")] == [0, 0, 0]
