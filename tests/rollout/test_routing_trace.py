"""The routing trace (routing_trace.jsonl): a rollout through the real path writes one record per trajectory whose
block hashes keep the prompts' shared prefixes (a GRPO group shares them all, the dataset's system prompt its
leading blocks) and whose turns rebuild every generation's prompt length; records are derived from the phases a
trajectory keeps, or from its mask when it has none."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.agent.routing_trace import (
    FILE_NAME,
    TraceRecord,
    TraceTurn,
    block_ids,
    prompt_blocks,
    read_routing_trace,
    trace_record,
)
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.agent.trajectory import Phase, Termination, Timings, ToolCallMetrics, Trajectory
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.run import RunRecord, run_rollout

from ..agent.conftest import TextScript, call, scripted_engine


def test_chained_block_hashes_share_exactly_the_shared_prefix():
    system = list(range(100, 140))  # 2.5 blocks of 16
    first, second = prompt_blocks(system + [7] * 20), prompt_blocks(system + [8] * 20)
    assert len(first) == 4 and first[:2] == second[:2] and first[2:] != second[2:]  # block 2 holds the divergence
    assert prompt_blocks(system + [7] * 20) == first and prompt_blocks([5] + system)[0] != first[0]
    assert all(re.fullmatch("[0-9a-f]{16}", h) for h in first)
    ids = block_ids(first[0], 16, 1000)
    assert ids == block_ids(first[0], 16, 1000) and ids != block_ids(first[1], 16, 1000)
    assert len(ids) == 16 and all(3 <= i < 1000 for i in ids)


def _trajectory(**overrides) -> Trajectory:
    fields = {
        "sample_id": "s-1", "loop": "tool", "group_id": "g", "prompt_ids": tuple(range(40)),
        "response_ids": (5, 6, 7, 0, 0, 8, 9), "response_mask": (1, 1, 1, 0, 0, 1, 1),
        "response_logprobs": (-0.1,) * 3 + (0.0,) * 2 + (-0.1,) * 2,
        "weight_versions": (0,) * 3 + (-1,) * 2 + (0,) * 2,
        "reward": 1.0, "termination": Termination.STOP, "timings": Timings(total_s=3.0, started_at=102.0),
        "tool_call_metrics": (ToolCallMetrics("calculator", 0, "c0", metrics={"seconds": 0.25}),),
        # a generation, a tool round, a generation, a tool round that ended the episode (not appended)
        "phases": (Phase("assistant", 3, 0.5), Phase("tool", 2, 0.3), Phase("assistant", 2, 0.4),
                   Phase("tool", 0, 0.1)),
    }
    return Trajectory(**{**fields, **overrides})


def test_a_record_has_the_phases_turns_and_survives_json():
    record = trace_record(_trajectory(), run_start=100.0)
    assert record.start_s == 2.0 and record.total_s == 3.0 and record.prompt_tokens == 40 and record.end_s == 0.1
    assert record.turns == (TraceTurn(0, 0.0, (), 3, 0.5), TraceTurn(2, 0.3, (0.25,), 2, 0.4))
    assert TraceRecord.from_json(record.to_json()) == record


def test_a_trajectory_without_phases_gets_its_turns_from_the_mask():
    record = trace_record(_trajectory(phases=()), run_start=100.0)
    assert record.turns == (TraceTurn(0, None, (), 3, None), TraceTurn(2, None, (), 2, None))
    assert record.end_s is None


@pytest.mark.slow
async def test_a_rollout_writes_the_routing_trace(tmp_path):
    replies = [call("calculator", expression="1 + 2"), call("check_answer", answer="3")]
    async with scripted_engine(TextScript(load_codec(None), replies)) as address:
        config = RolloutConfig.model_validate({
            "engines": {"addresses": [address]}, "tools": {"launch": "builtin"},
            "dataset": {"arithmetic": {"count": 3, "seed": 1}}, "samples_per_prompt": 2,
            "loop": {"max_assistant_turns": 3}, "output_dir": str(tmp_path / "out"), "report": False,
        })
        record = await run_rollout(config, Progress(Console(file=io.StringIO())), RunRecord(tmp_path / "out"))
    trajectories = {t.sample_id: t for t in read_parquet(tmp_path / "out" / "trajectories.parquet")}
    assert all(t.phases for t in trajectories.values())  # the phases survive Parquet
    trace = read_routing_trace(tmp_path / "out" / FILE_NAME)
    assert [r.sample_id for r in trace] == [t.sample_id for t in record.trajectories]
    for r in trace:
        t = trajectories[r.sample_id]
        assert r.group_id == t.group_id and r.prompt_tokens == len(t.prompt_ids)
        # a calculator round, then check_answer ends the episode (its round is not appended: end_s)
        assert [turn.generated_tokens > 0 for turn in r.turns] == [True, True] and r.end_s is not None and r.end_s > 0
        assert r.turns[0].context_tokens == 0 and r.turns[1].context_tokens > 0 and len(r.turns[1].tool_s) == 1
        assert all(turn.generate_s is not None and turn.generate_s > 0 for turn in r.turns)
        rebuilt = r.prompt_tokens + sum(turn.context_tokens + turn.generated_tokens for turn in r.turns)
        assert rebuilt == len(t.prompt_ids) + len(t.response_ids)  # every turn's prompt length is reproducible
    groups: dict[str, list[tuple[str, ...]]] = {}
    for r in trace:
        groups.setdefault(r.group_id, []).append(r.prompt_blocks)
    assert len(groups) == 3 and all(len(members) == 2 and members[0] == members[1] for members in groups.values())
    heads = [members[0] for members in groups.values()]
    shared = next(i for i, blocks in enumerate(zip(*heads, strict=False)) if len(set(blocks)) > 1)
    assert shared >= 4  # the system prompt's blocks are common to every group; the question's are not
