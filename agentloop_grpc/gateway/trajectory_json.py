"""A Trajectory as JSON (the answer of POST /sessions/{id}/finish): the Parquet row's fields, pictures as base64."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from agentloop_grpc.agent.trajectory import Trajectory


def trajectory_json(t: Trajectory) -> dict[str, Any]:
    row: dict[str, Any] = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    row["termination"] = t.termination.value
    row["timings"] = dataclasses.asdict(t.timings)
    row["drift"] = dataclasses.asdict(t.drift) if t.drift is not None else None
    row["tool_call_metrics"] = [dataclasses.asdict(c) for c in t.tool_call_metrics]
    row["media"] = [{"mime_type": m.mime_type, "data": base64.b64encode(m.data).decode(), "offset": m.offset,
                     "length": m.length} for m in t.media]
    return {name: list(value) if isinstance(value, tuple) else value for name, value in row.items()}
