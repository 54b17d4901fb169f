"""SGLang's streamed outputs read as deltas: both streaming modes, finish reasons, and misaligned logprobs."""

from __future__ import annotations

import pytest

from agentloop_grpc.common.types import FinishReason
from agentloop_grpc.engine_adapters.sglang.outputs import OutputReader, StreamEnd

TOKENS = [5, 6, 7, 8, 9]


def _outputs(incremental: bool, steps: list[int], finish: dict) -> list[dict]:
    """SGLang-shaped outputs emitting ``steps`` tokens at a time (cumulative lists unless incremental)."""
    outputs, done = [], 0
    for i, step in enumerate(steps):
        start, done = (done if incremental else 0), done + step
        logprobs = [(-0.1 * t, t, None) for t in TOKENS[:done]]
        top = [[(-0.1 * t, t, None), (-9.0, 0, None)] for t in TOKENS[:done]]
        meta = {
            "finish_reason": finish if i == len(steps) - 1 else None,
            "prompt_tokens": 12,
            "completion_tokens": done,
            "cached_tokens": 4,
            "output_token_logprobs": logprobs[start:],
            "output_top_logprobs": top[start:],
        }
        outputs.append({"output_ids": TOKENS[start:done], "meta_info": meta})
    return outputs


@pytest.mark.parametrize("incremental", [False, True])
def test_both_streaming_modes_give_the_same_deltas(incremental: bool) -> None:
    reader = OutputReader(logprobs=True, top_logprobs=2)
    deltas = [reader.read(o) for o in _outputs(incremental, [1, 0, 3, 1], {"type": "length", "length": 5})]
    assert [d.token_ids for d in deltas] == [(5,), (), (6, 7, 8), (9,)]
    assert [lp for d in deltas for lp in d.logprobs] == pytest.approx([-0.1 * t for t in TOKENS])
    assert next(alts for d in deltas for alts in d.top_logprobs) == ((5, pytest.approx(-0.5)), (0, -9.0))
    assert deltas[-1].end == StreamEnd(FinishReason.LENGTH, prompt_tokens=12, cached_tokens=4)
    assert all(d.end is None for d in deltas[:-1])


@pytest.mark.parametrize(
    ("finish", "end"),
    [
        ({"type": "stop", "matched": 9}, StreamEnd(FinishReason.STOP, 12, 4, matched_stop_token_id=9)),
        ({"type": "stop", "matched": "</s>"}, StreamEnd(FinishReason.STOP, 12, 4)),
        ({"type": "abort", "message": "aborted", "status_code": None}, StreamEnd(FinishReason.ABORT, 12, 4)),
        (
            {"type": "abort", "message": "bad grammar", "status_code": 400},
            StreamEnd(FinishReason.ABORT, 12, 4, rejected="bad grammar"),
        ),
    ],
)
def test_finish_reasons(finish: dict, end: StreamEnd) -> None:
    reader = OutputReader(logprobs=False, top_logprobs=0)
    assert reader.read(_outputs(False, [5], finish)[0]).end == end


def test_unknown_finish_reason_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="unknown finish reason"):
        OutputReader(False, 0).read(_outputs(False, [5], {"type": "surprise"})[0])


def test_logprobs_naming_other_tokens_are_an_error() -> None:
    output = _outputs(False, [5], {"type": "length", "length": 5})[0]
    output["meta_info"]["output_token_logprobs"][-1] = (-0.5, 1234, None)
    with pytest.raises(RuntimeError, match="do not name the streamed output_ids"):
        OutputReader(logprobs=True, top_logprobs=0).read(output)
