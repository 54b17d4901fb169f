"""Drift that explains itself: each departure of the recorded tokens from a fresh render is classified
(tokenization: same text, harmless; text: the template renders something else), placed, and shown with both
texts; summaries, the printed table and the report count them per kind with one example each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentloop_grpc.agent import AgentLoopConfig, Sample, Termination, read_parquet, write_parquet
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.agent.trajectory import Drift, drift_summary
from agentloop_grpc.rollout.progress import drift_line
from agentloop_grpc.rollout.report import drift_section
from agentloop_grpc.rollout.run import RunRecord, summarize

from .conftest import EOS, loop_context

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)


async def test_a_split_of_the_same_text_is_tokenization_drift(codec):
    canonical = codec.encode("hello world")
    split = codec.encode("hel") + codec.encode("lo world")  # same text, a tokenization the template never makes
    first = next(i for i, (a, b) in enumerate(zip(split, canonical)) if a != b)
    async with loop_context(codec, [split]) as (_, loops, _s):
        t = await loops.get("single_turn").run(Sample(sample_id="s", messages=QUESTION))
    assert list(t.response_ids[: len(split)]) == split  # the model's ids are kept, never re-tokenized
    drift = t.drift
    assert drift.kind == "tokenization" and drift.position == len(t.prompt_ids) + first
    assert (drift.recorded, drift.rendered) == (split[first], canonical[first])
    assert "hello world" in drift.recorded_text and drift.rendered_text.startswith(drift.recorded_text)


async def test_strict_mode_names_the_kind(codec):
    split = codec.encode("hel") + codec.encode("lo world")
    async with loop_context(codec, [split], AgentLoopConfig(drift_check="strict")) as (_, loops, _s):
        t = await loops.get("single_turn").run(Sample(sample_id="s", messages=QUESTION))
    assert t.failed and not t.infrastructure_failure and t.error.startswith("tokenization drift at token")


def test_a_wrong_delta_is_text_drift_at_the_token_where_the_texts_part(codec):
    messages = [*QUESTION, {"role": "assistant", "content": "It is 4."}, {"role": "user", "content": "Try again."}]
    prompt = codec.prompt_ids(QUESTION)
    wrong = codec.encode("\n<|im_start|>user\nTry harder.<|im_end|>\n<|im_start|>assistant\n")
    recorded = prompt + codec.encode("It is 4.") + [EOS] + wrong
    drift = codec.first_drift(messages, None, recorded, open_for_assistant=True)
    assert drift.kind == "text"
    assert codec.decode(recorded[: drift.position]).endswith("Try")
    assert codec.decode([recorded[drift.position]]) == " harder"
    assert drift.recorded_text.endswith("Try harder.<|im_end|>\n<|im_start|>assistant\n")
    assert "Try again." in drift.rendered_text and "It is 4." in drift.recorded_text
    right = prompt + codec.encode("It is 4.") + [EOS] + codec.delta_ids(messages[:2], messages[2:], None, EOS)
    assert codec.first_drift(messages, None, right, open_for_assistant=True) is None


async def test_summary_table_report_and_parquet_explain_the_counts(codec, tmp_path: Path):
    split = codec.encode("hel") + codec.encode("lo world")
    async with loop_context(codec, [split]) as (_, loops, _s):
        drifted = await loops.get("single_turn").run(Sample(sample_id="split", messages=QUESTION))
    async with loop_context(codec, ["It is 5."]) as (_, loops, _s):
        clean = await loops.get("single_turn").run(Sample(sample_id="clean", messages=QUESTION))
    text = dataclasses.replace(clean, sample_id="text", drift=Drift(30, 1, 2, "text", "It is 5.", "It is 6."))
    trajectories = [drifted, clean, text, dataclasses.replace(drifted, sample_id="split2")]
    assert drift_summary(trajectories) == {
        "tokenization": {"count": 2, "example": {"sample_id": "split", **dataclasses.asdict(drifted.drift)}},
        "text": {"count": 1, "example": {"sample_id": "text", **dataclasses.asdict(text.drift)}},
    }
    assert drift_summary([clean]) == {"tokenization": {"count": 0, "example": None},
                                      "text": {"count": 0, "example": None}}
    record = RunRecord(tmp_path, trajectories, RolloutMetrics.of(trajectories, 1.0))
    summary = summarize(record)
    assert summary["drifted_trajectories"] == 3 and summary["drift"]["tokenization"]["count"] == 2
    line = drift_line(summary)
    assert line.startswith("3: tokenization 2 (same text") and "text 1 (the template renders other text" in line
    section = drift_section(summary, codec)
    assert "<th>tokenization</th><td>2</td>" in section and "It is 6." in section and "split, token" in section
    assert read_parquet(write_parquet(trajectories, tmp_path / "t.parquet")) == trajectories
    assert clean.termination is Termination.STOP and clean.drift is None
