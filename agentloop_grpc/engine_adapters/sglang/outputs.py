"""SGLang's streamed outputs read as token deltas (in the actor), and the records sent to the adapter.

SGLang streams dicts whose ``output_ids`` and logprob lists are cumulative by default and only the new part
under ``incremental_streaming_output``; ``meta_info["completion_tokens"]`` is cumulative in both modes. So the
reader takes, from each output, the last ``completion_tokens - emitted`` entries of every list: the same code
reads both modes and never re-sends a token. Each logprob entry names its token; a mismatch with ``output_ids``
is an engine bug and raises, rather than letting a trajectory train on misaligned logprobs.

``StreamDelta`` is what crosses Ray from the actor to the adapter: plain frozen data, no SGLang types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agentloop_grpc.common.types import FinishReason

from .routing import RoutingLayout, packed_rows

_FINISH_TYPES = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
_BAD_REQUEST = 400


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a request ended, from SGLang's last ``meta_info``."""

    reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    matched_stop_token_id: int | None = None
    #: SGLang refused the request (abort with status 400, e.g. a grammar it cannot compile): its message.
    rejected: str | None = None
    #: The request's routing rows, packed (``routing.packed_rows``), when it asked for them; SGLang sends them
    #: with the finished output only.
    routed_experts: bytes = b""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """New tokens of one streamed output (possibly none), and the end if this output was the last."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    end: StreamEnd | None = None


def _suffix(values: list | None, count: int) -> list:
    if not count or not values:
        return []
    return values[len(values) - count :]


def expansion_mismatch(meta: dict[str, Any], prompt_len: int, images: int) -> StreamDelta | None:
    """The refusal to stream when SGLang's expansion of a prompt's images did not give the request's length back
    (``meta_info["prompt_tokens"]`` counts the ids SGLang runs); None when it did. Only the length can be checked:
    SGLang reports no prompt ids."""
    counted = int(meta["prompt_tokens"])
    if counted == prompt_len:
        return None
    message = (f"media: SGLang's expansion of the {images} image(s) makes a prompt of {counted} ids, the request has "
               f"{prompt_len}; send each image as the model processor's expansion of it")
    return StreamDelta((), end=StreamEnd(FinishReason.ABORT, counted, 0, rejected=message))


def read_end(meta: dict[str, Any]) -> StreamEnd | None:
    """The request's end from ``meta_info``, or None while it runs."""
    finish = meta.get("finish_reason")
    if finish is None:
        return None
    kind = finish.get("type")
    if kind not in _FINISH_TYPES:
        raise RuntimeError(f"SGLang reported an unknown finish reason {finish!r}")
    matched = finish.get("matched")
    status = finish.get("status_code")
    return StreamEnd(
        reason=_FINISH_TYPES[kind],
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        matched_stop_token_id=matched if kind == "stop" and isinstance(matched, int) else None,
        rejected=str(finish.get("message", "")) if kind == "abort" and status == _BAD_REQUEST else None,
    )


class OutputReader:
    """Turns one request's stream of SGLang outputs into StreamDeltas."""

    def __init__(self, logprobs: bool, top_logprobs: int, routing: RoutingLayout | None = None) -> None:
        self._logprobs = logprobs
        self._top = top_logprobs
        self._routing = routing  # set when the request asked for its routed experts
        self.emitted = 0

    def read(self, output: dict[str, Any]) -> StreamDelta:
        meta = output["meta_info"]
        new = int(meta["completion_tokens"]) - self.emitted
        token_ids = tuple(int(t) for t in _suffix(output["output_ids"], new))
        if len(token_ids) != new:
            raise RuntimeError(f"SGLang reported {new} new tokens but output_ids holds {len(token_ids)}")
        self.emitted += new
        logprobs: tuple[float, ...] = ()
        top: tuple[tuple[tuple[int, float], ...], ...] = ()
        if self._logprobs and new:
            entries = _suffix(meta.get("output_token_logprobs"), new)
            if [int(entry[1]) for entry in entries] != list(token_ids):
                raise RuntimeError("SGLang's output_token_logprobs do not name the streamed output_ids")
            logprobs = tuple(float(entry[0]) for entry in entries)
            if self._top:
                positions = _suffix(meta.get("output_top_logprobs"), new)
                top = tuple(
                    tuple((int(alt[1]), float(alt[0])) for alt in (alts or ())[: self._top]) for alts in positions
                )
                if len(top) != new:
                    raise RuntimeError("SGLang's output_top_logprobs do not cover every streamed token")
        end = read_end(meta)
        if end is not None and self._routing is not None:
            end = replace(end, routed_experts=packed_rows(meta.get("routed_experts"), self._routing))
        return StreamDelta(token_ids, logprobs, top, end)
