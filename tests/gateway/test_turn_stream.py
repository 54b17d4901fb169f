"""A turn's streamed text and logprobs when the end-of-turn token arrives in one chunk with the last text token,
before the engine's result (as a stream delivers them when its reader falls behind): never shown, neither as
text nor as a logprob."""

from __future__ import annotations

from agentloop_grpc.common.types import FinishReason, SamplingParams, TokenChunk
from agentloop_grpc.gateway.exchange import TextDelta
from agentloop_grpc.gateway.turn import TurnOutput, TurnRun, TurnSpec
from agentloop_grpc.router import GenerateResult

EOS = 2


class RecordedStream:
    """Replays one stream's events, as the Router yields them (a stand-in for the Router in this unit test)."""

    def __init__(self, events) -> None:
        self.events = events

    def stream(self, call, final_only: bool = False):
        async def replay():
            for event in self.events:
                yield event
        return replay()


async def test_the_end_of_turn_token_streams_neither_as_text_nor_as_a_logprob(codec):
    ids = codec.encode("Hi there.")
    chunks = [TokenChunk((t,), 0, (-0.5,), (((t, -0.5),),)) for t in ids[:-1]]
    chunks.append(TokenChunk((ids[-1], EOS), 0, (-0.5, -0.1), (((ids[-1], -0.5),), ((EOS, -0.1),))))
    result = GenerateResult("r", "s", (*ids, EOS), (-0.5,) * len(ids) + (-0.1,), (), (0,) * (len(ids) + 1),
                            FinishReason.STOP, EOS, 5, 0, ("a",), 0, 0.1)
    spec = TurnSpec("s", [1, 2, 3], (), SamplingParams(16, logprobs=True, top_logprobs=1), None, (), 10.0, 0, True,
                    True)
    events = [e async for e in TurnRun(RecordedStream([*chunks, result]), codec, spec, frozenset({EOS})).run()]
    deltas = [e for e in events if isinstance(e, TextDelta)]
    (out,) = [e for e in events if isinstance(e, TurnOutput)]
    assert "".join(d.text for d in deltas) == "Hi there." == out.visible
    assert [t.token_id for d in deltas for t in d.logprobs] == ids  # the end of turn left out
    assert out.token_ids == [*ids, EOS] and out.stopped_on == EOS
