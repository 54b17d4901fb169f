"""One model turn through the Router: tokens streamed as the engine produces them, stop strings, resumes.

The turn's tokens are kept here and handed to the chain only when the turn is whole, so a client that goes away
mid-stream (or a turn that fails) leaves its chain as it was, still appendable. A turn aborted by a weight update
(Pause with ABORT) is resumed by the Router (``GenerateCall.max_resumes``, the rule our loops' turns follow too):
its tokens so far as prompt and what is left of its budget; each token keeps the weight version that produced it.

Text streams as it decodes, held back where it could still change: an unfinished UTF-8 character, a trailing stop
token (the turn's text never shows it), and the tail that could begin a stop string. A stop string ends the turn:
the stream is closed (the Router cancels the engine's request), the reply's text ends before it, and the tokens
received stay in the trajectory as the model produced them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.routed_experts import TurnRouting
from agentloop_grpc.common.types import FinishReason, SamplingParams, StructuredOutput, TokenChunk
from agentloop_grpc.router import GenerateCall, GenerateResult, InfrastructureError, Router

from .exchange import TextDelta, TokenLogprob


@dataclass(slots=True)
class TurnOutput:
    """A whole turn: the engine's tokens and what the client is told of them."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.STOP
    #: The stop token that ended the turn (None: length, or a stop string).
    stopped_on: int | None = None
    #: The model's text (its tokens decoded, the stop token left out): what the chain renders.
    text: str = ""
    #: What the client reads: ``text`` cut before a stop string.
    visible: str = ""
    stop_string: str | None = None
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    seconds: float = 0.0
    servers: list[str] = field(default_factory=list)
    resumes: int = 0
    #: The turn's routed experts when asked (GatewayConfig.return_routed_experts); None when a stop string ended
    #: the turn before its result (the trajectory's routing then ends before it).
    routed_experts: TurnRouting | None = None


@dataclass(frozen=True, slots=True)
class TurnSpec:
    session_key: str
    prompt_ids: Sequence[int]
    media: tuple[MediaInput, ...]
    sampling: SamplingParams
    structured_output: StructuredOutput | None
    stop_strings: tuple[str, ...]
    timeout_s: float
    max_resumes: int
    #: Whether to yield TextDeltas as text decodes (False: only the TurnOutput at the end).
    stream_text: bool
    #: Whether the deltas carry logprobs.
    logprobs: bool
    #: The session's GRPO group ("": none), for the Router's group affinity.
    group_id: str = ""
    #: What of the text so far may stream, where not all of it: a turn offered tools streams only the content its
    #: parser says no call can change (``ToolCallParser.settled_content``); the reply's content holds the rest.
    settled: Callable[[str], str] | None = None


class TurnRun:
    """Runs one model turn of a session (the agent loops' finished turn is ``agent.generation.Turn``); ``run()``
    yields TextDeltas (when asked) and then the TurnOutput."""

    def __init__(self, router: Router, codec: ChatCodec, spec: TurnSpec, end_ids: frozenset[int]) -> None:
        self.router = router
        self.codec = codec
        self.spec = spec
        self.end_ids = end_ids  # the ids that end a turn: never shown as text
        self.out = TurnOutput()
        self._shown = 0  # characters of visible text already yielded
        self._shown_tokens = 0  # tokens whose logprobs were already yielded

    async def run(self) -> AsyncIterator[TextDelta | TurnOutput]:
        spec = self.spec
        call = GenerateCall(
            session_id=spec.session_key, prompt_ids=spec.prompt_ids, sampling=spec.sampling,
            structured_output=spec.structured_output, timeout_s=spec.timeout_s, media=spec.media,
            group_id=spec.group_id, max_resumes=spec.max_resumes,
        )
        result = None
        if not spec.stream_text and not spec.stop_strings:
            # nothing to see before the end: generate() takes the unary RPC where the turn fits one message
            result = await self.router.generate(call)
            self._add_all(result)
            async for last in self._ended(result):
                yield last
            return
        events = self.router.stream(call)
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, GenerateResult):
                    result = event
                    break
                self._add(event)
                if self._cut_at_stop_string():
                    break
                if spec.stream_text and (delta := self._delta(final=False)) is not None:
                    yield delta
        async for last in self._ended(result):
            yield last

    async def _ended(self, result: GenerateResult | None) -> AsyncIterator[TextDelta | TurnOutput]:
        """The last text (when streamed) and the whole turn."""
        spec, out = self.spec, self.out
        if out.stop_string is not None:
            out.finish_reason = FinishReason.STOP
        elif result is None:
            raise InfrastructureError("the engine's stream ended without a result")
        else:
            self._end(result)
            if result.finish_reason is FinishReason.ABORT:
                raise InfrastructureError(f"the turn was aborted more than max_resumes={spec.max_resumes} times")
            out.text = self.codec.assistant_text(out.token_ids, out.stopped_on)
            out.visible = out.text
        if spec.stream_text and (delta := self._delta(final=True)) is not None:
            yield delta
        yield out

    def _add_all(self, result: GenerateResult) -> None:
        out = self.out
        out.token_ids = list(result.token_ids)
        out.logprobs = list(result.logprobs) if result.logprobs else [0.0] * len(result.token_ids)
        out.top_logprobs = list(result.top_logprobs) if result.top_logprobs else [()] * len(result.token_ids)
        out.weight_versions = list(result.weight_versions)

    def _add(self, chunk: TokenChunk) -> None:
        out = self.out
        n = len(chunk.token_ids)
        out.token_ids += chunk.token_ids
        out.logprobs += chunk.logprobs if chunk.logprobs else [0.0] * n
        out.top_logprobs += chunk.top_logprobs if chunk.top_logprobs else [()] * n
        out.weight_versions += [chunk.weight_version] * n

    def _end(self, result: GenerateResult) -> None:
        out = self.out
        out.finish_reason = result.finish_reason
        out.stopped_on = result.matched_stop_token_id if result.finish_reason is FinishReason.STOP else None
        out.seconds = result.seconds
        out.servers = list(dict.fromkeys(result.servers))
        out.resumes = result.resumes
        out.routed_experts = result.routed_experts
        out.prompt_tokens, out.cached_prompt_tokens = result.prompt_tokens, result.cached_prompt_tokens

    def _text_so_far(self) -> str:
        ids = self.out.token_ids
        if ids and ids[-1] in self.end_ids:  # maybe the stop token: the client never reads it
            ids = ids[:-1]
        return self.codec.decode(ids)

    def _cut_at_stop_string(self) -> bool:
        if not self.spec.stop_strings:
            return False
        text = self._text_so_far()
        found = [(text.find(s), s) for s in self.spec.stop_strings if s and s in text]
        if not found:
            return False
        at, stop = min(found)
        out = self.out
        out.text, out.visible, out.stop_string, out.stopped_on = text, text[:at], stop, None
        return True

    def _delta(self, final: bool) -> TextDelta | None:
        out = self.out
        if final:
            text = out.visible
        else:
            text = self._text_so_far()
            if text.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
                return None
            hold = max((len(s) - 1 for s in self.spec.stop_strings), default=0)
            text = text[: len(text) - hold] if hold else text
        if self.spec.settled is not None:
            text = self.spec.settled(text)
        piece = text[self._shown :] if len(text) > self._shown else ""
        logprobs: tuple[TokenLogprob, ...] = ()
        if self.spec.logprobs:
            upto = len(out.token_ids)
            if not final and upto and out.token_ids[-1] in self.end_ids:  # maybe the end of turn: told at the end
                upto -= 1
            logprobs = token_logprobs(self.codec, out, self._shown_tokens, upto, self.end_ids)
            self._shown_tokens = max(self._shown_tokens, upto)
        if not piece and not logprobs:
            return None
        self._shown = max(self._shown, len(text))
        return TextDelta(piece, logprobs)


def token_logprobs(codec: ChatCodec, out: TurnOutput, start: int, stop: int,
                   end_ids: frozenset[int] = frozenset()) -> tuple[TokenLogprob, ...]:
    """OpenAI-style logprobs of tokens ``start:stop`` of the turn (a final end-of-turn token left out)."""
    items = []
    for i in range(start, stop):
        token = out.token_ids[i]
        if i == len(out.token_ids) - 1 and token in end_ids and out.stopped_on == token:
            continue
        top = tuple((codec.decode([t]), lp) for t, lp in out.top_logprobs[i])
        items.append(TokenLogprob(token, codec.decode([token]), out.logprobs[i], top))
    return tuple(items)

