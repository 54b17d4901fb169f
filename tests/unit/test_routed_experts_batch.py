"""Placing routing rows in a trainer's int16 batch (routed_experts.placed)."""

from __future__ import annotations

import numpy as np
import pytest

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.routed_experts import Routing


def _routing(ids: list[list[list[int]]], num_experts: int) -> Routing:
    array = np.array(ids)
    return Routing(array.shape[1], array.shape[2], num_experts, routed_experts.pack(array, num_experts))


def test_rows_land_at_their_start_and_unknown_positions_are_minus_one() -> None:
    routing = _routing([[[1, 2]], [[3, 299]]], 300)
    out = routed_experts.placed([routing, None], [1, 0], 4)
    assert out is not None and out.dtype == np.int16
    assert out[0, :, 0].tolist() == [[-1, -1], [1, 2], [3, 299], [-1, -1]]
    assert (out[1] == -1).all()


def test_a_model_whose_expert_ids_overflow_int16_is_refused_by_name() -> None:
    """uint16 ids above 32,767 would wrap to negative numbers (read as 'unknown') in the int16 batch."""
    routing = _routing([[[40_000, 7]]], 40_001)
    with pytest.raises(ValueError, match=r"40001 experts.*32768"):
        routed_experts.placed([routing], [0], 1)
