"""A Trajectory as JSON (the answer of POST /sessions/{id}/finish): the Parquet row's fields, pictures and routed
experts' packed ids as base64."""

from __future__ import annotations

import base64
from typing import Any

from agentloop_grpc.agent.parquet import trajectory_fields
from agentloop_grpc.agent.trajectory import Trajectory


def trajectory_json(t: Trajectory) -> dict[str, Any]:
    row = trajectory_fields(t)
    row["media"] = [{**m, "data": base64.b64encode(m["data"]).decode()} for m in row["media"]]
    if (routing := row["routed_experts"]) is not None:
        row["routed_experts"] = {**routing, "ids": base64.b64encode(routing["ids"]).decode()}
    return row
