"""Trajectories to and from Parquet (pyarrow): one row per trajectory, token lists as list columns, the
conversation and metrics as JSON text so any reader (pandas, DuckDB, Spark) can open the file. ``media`` is a list of
structs (mime_type, data as binary, offset, length): the pictures themselves, so the file alone rebuilds the
model's inputs. ``routed_experts`` is a struct (layers, per_token, num_experts, ids as binary: the packed routing,
as Routing holds it), null where none was recorded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.routed_experts import Routing

from .trajectory import Drift, Phase, Termination, Timings, ToolCallMetrics, Trajectory

_JSON_FIELDS = ("messages", "metrics", "tool_call_metrics", "phases", "metadata")


def trajectory_fields(t: Trajectory) -> dict[str, Any]:
    """Every field of ``t`` as plain values (enums by value, nested records as dicts, pictures as dicts with their
    bytes): what a Parquet row and the gateway's JSON are made of."""
    row = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    row["termination"] = t.termination.value
    row["timings"] = dataclasses.asdict(t.timings)
    row["drift"] = dataclasses.asdict(t.drift) if t.drift is not None else None
    row["tool_call_metrics"] = [dataclasses.asdict(c) for c in t.tool_call_metrics]
    row["phases"] = [dataclasses.asdict(p) for p in t.phases]
    row["media"] = [{"mime_type": m.mime_type, "data": m.data, "offset": m.offset, "length": m.length}
                    for m in t.media]
    row["routed_experts"] = dataclasses.asdict(t.routed_experts) if t.routed_experts is not None else None
    return {name: list(value) if isinstance(value, tuple) else value for name, value in row.items()}


def _row(t: Trajectory) -> dict:
    row = trajectory_fields(t)
    for name in _JSON_FIELDS:
        row[name] = json.dumps(row[name], default=str)
    return row


def write_parquet(trajectories: Sequence[Trajectory], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([_row(t) for t in trajectories])
    pq.write_table(table, path)
    return path


def read_parquet(path: str | Path) -> list[Trajectory]:
    import pyarrow.parquet as pq

    trajectories = []
    for row in pq.read_table(Path(path)).to_pylist():
        row.setdefault("tool_call_metrics", "[]")  # files written before the column existed
        row.setdefault("infrastructure_cause", None)  # likewise
        row.setdefault("phases", "[]")  # likewise
        row.setdefault("metadata", "{}")  # likewise
        row["termination"] = Termination(row["termination"])
        row["timings"] = Timings(**row["timings"])
        row["drift"] = Drift(**row["drift"]) if row["drift"] is not None else None
        for name in _JSON_FIELDS:
            row[name] = json.loads(row[name])
        row["messages"] = tuple(row["messages"])
        row["tool_call_metrics"] = [ToolCallMetrics(**c) for c in row["tool_call_metrics"]]
        row["phases"] = [Phase(**p) for p in row["phases"]]
        row["media"] = [MediaInput(**m) for m in row.get("media") or ()]  # files written before images: none
        routing = row.get("routed_experts")  # files written before routing: none
        row["routed_experts"] = Routing(**routing) if routing is not None else None
        for f in dataclasses.fields(Trajectory):
            if isinstance(row[f.name], list):
                row[f.name] = tuple(row[f.name])
        trajectories.append(Trajectory(**row))
    return trajectories
