"""A ChatReply written as the OpenAI Responses API's ``Response`` object and its output items (the stream events
of openai_responses.py carry the same objects)."""

from __future__ import annotations

import math
from typing import Any

from .exchange import ChatReply, ChatRequest, TokenLogprob, agentloop_extension

# A logprob JSON can carry (-inf is not JSON); far below any sampled token's.
_LOGPROB_FLOOR = -9999.0


def output_items(rid: str, reply: ChatReply, *, message: bool = False) -> list[dict[str, Any]]:
    """The output items: the text's message (when there is text, or ``message``), then each function call."""
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    base = rid.removeprefix("resp_")
    output: list[dict[str, Any]] = []
    if reply.content or message:
        text: dict[str, Any] = {"type": "output_text", "text": reply.content, "annotations": []}
        if reply.logprobs:
            text["logprobs"] = [output_logprob(lp) for lp in reply.logprobs]
        output.append(
            {"id": f"msg_{base}", "type": "message", "role": "assistant", "status": status, "content": [text]}
        )
    output += [function_call_item(rid, i, call) for i, call in enumerate(reply.tool_calls)]
    return output


def function_call_item(rid: str, index: int, call: dict[str, Any]) -> dict[str, Any]:
    """The reply's call ``index`` as a ``function_call`` output item."""
    return {
        "id": f"fc_{rid.removeprefix('resp_')}_{index}",
        "type": "function_call",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def response_object(
    rid: str,
    created_at: int,
    model: str,
    request: ChatRequest | None,
    output: list[dict[str, Any]],
    reply: ChatReply | None,
) -> dict[str, Any]:
    """A Response object: in progress while ``reply`` is None; the request's fields echoed where it is given."""
    if reply is None:
        status = "in_progress"
    else:
        status = "incomplete" if reply.finish_reason == "length" else "completed"
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "top_logprobs": None,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
        "background": False,
        "service_tier": "default",
        "user": None,
        "usage": None,
    }
    if request is not None:
        choice = request.tool_choice
        response.update(
            tool_choice=choice if isinstance(choice, str) else {"type": "function", "name": choice["name"]},
            tools=[
                {"type": "function", "strict": None, "description": None, "parameters": None, **t["function"]}
                for t in request.tools
            ],
            temperature=request.temperature,
            top_p=request.top_p,
            max_output_tokens=request.max_tokens,
            top_logprobs=request.top_logprobs if request.logprobs else None,
        )
    if reply is not None:
        response["usage"] = {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_prompt_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        response["agentloop"] = agentloop_extension(reply)
    return response


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _LOGPROB_FLOOR


def output_logprob(lp: TokenLogprob, *, with_bytes: bool = True) -> dict[str, Any]:
    """As a Response's output_text reports it (with each token's UTF-8 bytes), or a stream's text events
    (``with_bytes`` False)."""

    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, **({"bytes": list(token.encode())} if with_bytes else {}), "logprob": _finite(logprob)}

    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
