"""The gateway's one internal request and reply, which every wire format (OpenAI Chat Completions, OpenAI
Responses, Anthropic Messages) is translated to and from.

Messages are OpenAI-chat-shaped dicts, the shape our loops and chat templates already use:
``{"role": "system" | "user" | "assistant" | "tool", "content": str | [parts]}``, where a part is
``{"type": "text", "text": ...}`` or ``{"type": "image", "image": "data:<mime>;base64,..."}``; an assistant message
may carry ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}]``); a tool
message carries ``tool_call_id`` (and ``name`` where the wire format says it). Tools are OpenAI function specs
(``{"type": "function", "function": {"name", "description", "parameters"}}``).

A wire format's translation owns only its own shapes: it never touches token ids, sessions or the Router.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: What a request asks of tool calls (OpenAI's ``tool_choice``; Anthropic's maps onto it): ``{"name": ...}`` forces
#: that function.
ToolChoice = Literal["auto", "none", "required"] | dict[str, str]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One model turn asked for, every wire format's fields mapped onto these."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = "auto"
    #: None: the gateway's per-turn limit (and what is left of the session's response budget).
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    #: Strings that end the reply (not included in it).
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    #: The model name the client asked for (echoed back; the gateway serves one model).
    model: str = ""
    #: Whether the client asks for the model's thinking mode (Anthropic's ``thinking``, OpenAI's reasoning effort;
    #: None: it does not say).
    thinking: bool | None = None
    #: What the request held that the gateway accepted and ignored (wire_checks.ignore): fields it does not know,
    #: hosted tools left out of what the model sees.
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token as OpenAI's ``logprobs.content`` reports it."""

    token_id: int
    #: The token's text (decoded alone, special tokens kept).
    token: str
    logprob: float
    #: ``(text, logprob)`` of the most likely tokens at that step, most likely first (the sampled one may be among
    #: them).
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text of the reply as it streams (only outside tool calls: a turn offered tools streams its text at the
    end, once its calls are parsed)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChatReply:
    """The model's turn as the client sees it, with the engine's token ids for a client that checks them."""

    id: str
    model: str
    #: Text outside tool calls.
    content: str
    #: OpenAI-shaped, ``arguments`` as JSON text; ids made by the gateway.
    tool_calls: tuple[dict[str, Any], ...]
    finish_reason: FinishReason
    #: The ids the engine produced for this turn, exactly (the end-of-turn token included when it stopped on one).
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    created: int = 0
    #: Which chain of the session this turn extended (0: the first) and whether it forked one.
    chain: int = 0
    forked: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class GatewayError(Exception):
    """A request the gateway refuses or could not serve, told in each API's own error shape.

    ``status``: the HTTP status; ``kind``, the same in every format (OpenAI's formats send it as ``code``;
    Anthropic's maps it onto its error type), one of:

    - ``invalid_request`` (400): a field of the request is wrong (``param`` names it), or the engine refused it;
    - ``unauthenticated`` (401): no valid bearer token (app.py);
    - ``not_found`` (404): no such session (finished, expired or never created);
    - ``conflict`` (409): a session that exists already, or one finished with requests in flight;
    - ``too_large`` (413): a body over ``max_body_bytes``;
    - ``rate_limit`` (429): the gateway's session or per-session concurrency limits;
    - ``infrastructure`` (502): the engines failed the request; never the model's fault;
    - ``unavailable`` (503): retryable (``retry_after_s``), e.g. the engines paused for a weight update.

    ``param``: the request field at fault, where one is.
    """

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request", param: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param
        self.retry_after_s = retry_after_s


def agentloop_extension(reply: ChatReply) -> dict[str, Any]:
    """What every format adds to its reply under ``agentloop``: the turn's token ids as the engine produced them,
    and which chain of the session the turn extended (and whether it forked one)."""
    return {"token_ids": list(reply.token_ids), "chain": reply.chain, "forked": reply.forked}
