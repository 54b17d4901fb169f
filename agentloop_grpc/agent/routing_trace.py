"""The routing trace: what a rollout asked of its engines, without its text or token ids, so routing policies can
be replayed at scale against fake engines (bench/routing_replay.py).

One record per trajectory (``routing_trace.jsonl`` beside ``trajectories.parquet``; docs/rollout.md has the
format). Shared prefixes survive without the ids: the prompt is cut into blocks of ``block_size`` ids and each
block named by a hash chained over the blocks before it (as vLLM names its prefix-cache blocks), so two prompts
share their first k hashes exactly when they share their first k blocks: the samples of a GRPO group share all of
them, prompts with one system prompt its blocks. A replay rebuilds ids from the hashes (``block_ids``), so the
rebuilt prompts share what the real ones shared. The turns come from the trajectory's phases (every generation
and the tool round or user turn before it: their tokens and seconds); a trajectory without phases (the
gateway's) gets them from its response mask, without seconds.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .trajectory import Trajectory

#: The file name in a rollout's output directory.
FILE_NAME = "routing_trace.jsonl"
#: Ids per hashed prompt block (vLLM's default KV block; the fake engine's too).
BLOCK_SIZE = 16
#: Bumped when a field changes meaning; readers refuse other versions.
VERSION = 1


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One generation and what came before it."""

    #: Tokens appended to the context since the previous generation (tool responses, user turns, template
    #: separators); 0 for the first turn.
    context_tokens: int
    #: Seconds the phases that produced them took (a tool round: its calls, concurrently); None when unknown.
    wait_s: float | None
    #: Seconds of each tool call of that round as its tool server measured it (its ``seconds`` metric).
    tool_s: tuple[float, ...]
    #: Tokens the engine generated in this turn.
    generated_tokens: int
    #: Seconds the generation took (every attempt, queueing included); None when unknown.
    generate_s: float | None


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One trajectory of the trace."""

    sample_id: str
    group_id: str
    loop: str
    termination: str
    #: When it started, in seconds after the first trajectory of the run started.
    start_s: float
    #: Its wall seconds, start to end (reward included).
    total_s: float
    prompt_tokens: int
    block_size: int
    #: Chained hashes of the prompt's blocks, 16 hex digits each; the last block may be partial.
    prompt_blocks: tuple[str, ...]
    turns: tuple[TraceTurn, ...]
    #: Seconds of the phases after the last generation (a tool round that ended the episode); None when unknown.
    end_s: float | None
    version: int = VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> TraceRecord:
        if row.get("version") != VERSION:
            raise ValueError(f"routing trace version {row.get('version')!r} is not {VERSION}")
        turns = tuple(TraceTurn(**{**turn, "tool_s": tuple(turn["tool_s"])}) for turn in row["turns"])
        return cls(**{**row, "prompt_blocks": tuple(row["prompt_blocks"]), "turns": turns})


def prompt_blocks(ids: Sequence[int], block_size: int = BLOCK_SIZE) -> list[str]:
    """The chained hashes of ``ids``' blocks (each covers its block and every block before it)."""
    hashes, parent = [], b""
    for start in range(0, len(ids), block_size):
        digest = hashlib.blake2b(parent + array("i", ids[start:start + block_size]).tobytes(), digest_size=8)
        parent = digest.digest()
        hashes.append(digest.hexdigest())
    return hashes


def block_ids(block_hash: str, length: int, vocab_size: int, low: int = 3) -> list[int]:
    """Ids standing in for a block named ``block_hash`` (a replay's prompt): a function of the hash alone, drawn
    in [low, vocab_size) so they avoid the usual special ids."""
    return stream_ids(int(block_hash, 16), length, vocab_size, low)


def stream_ids(seed: int, length: int, vocab_size: int, low: int = 3) -> list[int]:
    """``length`` ids drawn uniformly from [low, vocab_size), a function of ``seed`` alone."""
    return np.random.default_rng(seed).integers(low, vocab_size, length, dtype=np.int32).tolist()


def _turns_from_phases(t: Trajectory) -> tuple[list[TraceTurn], float]:
    calls: dict[int, list[float]] = {}
    for call in t.tool_call_metrics:
        if "seconds" in call.metrics:
            calls.setdefault(call.turn, []).append(call.metrics["seconds"])
    turns: list[TraceTurn] = []
    tokens, seconds = 0, 0.0
    for phase in t.phases:
        if phase.kind != "assistant":
            tokens, seconds = tokens + phase.tokens, seconds + phase.seconds
            continue
        tool_s = tuple(calls.get(len(turns) - 1, ())) if turns else ()
        turns.append(TraceTurn(tokens, round(seconds, 6), tuple(round(s, 6) for s in tool_s), phase.tokens,
                               round(phase.seconds, 6)))
        tokens, seconds = 0, 0.0
    return turns, round(seconds, 6)


def _turns_from_mask(t: Trajectory) -> list[TraceTurn]:
    """Runs of model tokens are generations; the run of other tokens before each is its context."""
    turns: list[TraceTurn] = []
    context = generated = 0
    for mask in t.response_mask:
        if mask:
            generated += 1
            continue
        if generated:
            turns.append(TraceTurn(context, None, (), generated, None))
            context = generated = 0
        context += 1
    if generated:
        turns.append(TraceTurn(context, None, (), generated, None))
    return turns


def trace_record(t: Trajectory, run_start: float, block_size: int = BLOCK_SIZE) -> TraceRecord:
    """``t``'s record; ``run_start``: the wall-clock start (``Timings.started_at``) of the run's first
    trajectory."""
    if t.phases:
        turns, end_s = _turns_from_phases(t)
    else:
        turns, end_s = _turns_from_mask(t), None
    return TraceRecord(
        sample_id=t.sample_id,
        group_id=t.group_id,
        loop=t.loop,
        termination=t.termination.value,
        start_s=round(t.timings.started_at - run_start, 6),
        total_s=round(t.timings.total_s, 6),
        prompt_tokens=len(t.prompt_ids),
        block_size=block_size,
        prompt_blocks=tuple(prompt_blocks(t.prompt_ids, block_size)),
        turns=tuple(turns),
        end_s=end_s,
    )


def write_routing_trace(trajectories: Sequence[Trajectory], path: str | Path,
                        block_size: int = BLOCK_SIZE) -> Path:
    """One line per trajectory, in the given order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    run_start = min((t.timings.started_at for t in trajectories), default=0.0)
    with path.open("w", encoding="utf-8") as out:
        for t in trajectories:
            out.write(json.dumps(trace_record(t, run_start, block_size).to_json()) + "\n")
    return path


def write_records(records: Iterable[TraceRecord], path: str | Path) -> Path:
    """Records as the rollout writes them (a synthesized trace, a rewritten one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json()) + "\n")
    return path


def read_routing_trace(path: str | Path) -> list[TraceRecord]:
    return [TraceRecord.from_json(json.loads(line))
            for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
