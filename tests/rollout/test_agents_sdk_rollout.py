"""`agentloop rollout` with an unmodified OpenAI Agents SDK agent (``agent: {callable: ...}``) on the real default
model (an embedded SmolLM2 engine the run launches): the run writes train-ready outputs, and every trajectory is
token-exact or an infrastructure failure that says why (the 135M model may write junk: recorded, never a crash).
"""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from agentloop_grpc.agent import read_parquet
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.progress import Progress
from agentloop_grpc.rollout.run import RunRecord, run_rollout

from .agents_sdk_agent import PATH

pytestmark = pytest.mark.slow

ROWS = [
    {"id": "mul", "messages": [{"role": "user", "content": "What is 17 * 23? Use the calculator."}],
     "ground_truth": "391"},
    {"id": "add", "messages": [{"role": "user", "content": "What is 120 + 45? Use the calculator."}],
     "ground_truth": "165"},
]
SAMPLES_PER_PROMPT = 2


def _config(tmp_path: Path) -> RolloutConfig:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return RolloutConfig.model_validate({
        "engines": {"launch": {"replicas": 1, "engine": {"kind": "embedded", "max_running": 4,
                                                         "max_model_len": 2048}}},
        "tools": {"launch": None},  # the agent runs its own calculator
        "dataset": {"path": str(data)},
        "samples_per_prompt": SAMPLES_PER_PROMPT,
        "agent": {"callable": f"{PATH}:sdk_agent", "timeout_s": 90, "max_concurrency": 4,
                  "gateway": {"sampling": {"max_tokens_per_turn": 32}}},
        "output_dir": str(tmp_path / "out"),
        "report": False,
        "trace": False,
    })


def _model_turns(t) -> list[list[float]]:
    """The logprobs of each assistant turn: the runs of mask 1."""
    turns: list[list[float]] = []
    previous = 0
    for m, logprob in zip(t.response_mask, t.response_logprobs, strict=True):
        if m and not previous:
            turns.append([])
        if m:
            turns[-1].append(logprob)
        previous = m
    return turns


def _token_exact(t) -> None:
    # the 135M model may write a non-canonical tokenization of its own text (the ids are the truth), never a text
    # drift
    assert t.drift is None or t.drift.kind == "tokenization", (t.sample_id, t.drift)
    assert set(t.response_mask) <= {0, 1} and 1 in t.response_mask
    assert len(t.response_ids) == len(t.response_mask) == len(t.response_logprobs)
    assert all(logprob == 0 for m, logprob in zip(t.response_mask, t.response_logprobs, strict=True) if not m)
    first, *later = _model_turns(t)
    assert len(later) + 1 == t.assistant_turns
    # the first turn is grammar-forced (tool_choice required): a token the grammar alone allowed has probability 1
    # under the masked distribution the engine reports, so logprob 0.0; the SDK then resets tool_choice to auto
    assert all(math.isfinite(logprob) and logprob <= 0 for logprob in first) and any(first), (t.sample_id, first)
    assert all(logprob < 0 for turn in later for logprob in turn), (t.sample_id, later)


async def test_an_agents_sdk_agent_on_the_embedded_engine_gives_train_ready_trajectories(tmp_path):
    config = _config(tmp_path)
    started = time.monotonic()
    record = await run_rollout(config, Progress(Console(file=io.StringIO())), RunRecord(output_dir=tmp_path / "out"))
    print(f"rollout: {time.monotonic() - started:.1f}s")
    ts = record.trajectories
    assert ts and not record.interrupted
    # every session recorded as ONE chain: the SDK's echo of the model's turn (call, malformed call or text) appends
    assert [t.sample_id for t in ts] == [f"{row['id']}/{i}" for row in ROWS for i in range(SAMPLES_PER_PROMPT)]
    for t in ts:
        assert t.loop == "gateway"
        # GRPO: the samples of a row share its group
        assert t.group_id == t.sample_id.split("/")[0]
        if t.infrastructure_failure:
            assert t.error, t.sample_id  # a failure says why
        else:
            _token_exact(t)
            assert t.assistant_turns >= 1
    out = tmp_path / "out"
    assert (out / "trajectories.parquet").is_file() and (out / "batch.pt").is_file()
    assert [t.sample_id for t in read_parquet(out / "trajectories.parquet")] == [t.sample_id for t in ts]
    batch = torch.load(out / "batch.pt", weights_only=False)
    kept = [t for t in ts if not t.failed]  # failures are kept in the Parquet, never trained on
    assert batch["sample_ids"] == [t.sample_id for t in kept] and batch["group_ids"] == [t.group_id for t in kept]
    assert batch["excluded"] == [t.sample_id for t in ts if t.failed]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == len(ts)
    assert summary["infrastructure_failures"] == sum(t.infrastructure_failure for t in ts)
