"""A GenerateCall refuses, by name and bound, every value its request message could not carry (protobuf would
raise only once the request is built, naming no field); values the wire carries are the engines' to judge."""

from __future__ import annotations

import numpy as np
import pytest

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router import GenerateCall


@pytest.mark.parametrize(("fields", "needle"), [
    ({"seed": -1}, r"sampling\.seed = -1 must be an int in \[0, 2\*\*64 - 1\]"),
    ({"seed": 2**64}, r"sampling\.seed = 18446744073709551616 must be an int in \[0, 2\*\*64 - 1\]"),
    ({"seed": 1.5}, r"sampling\.seed = 1\.5 must be an int"),
    ({"max_new_tokens": 2**31}, r"sampling\.max_new_tokens = 2147483648 must be an int in \[-2\*\*31, 2\*\*31 - 1\]"),
    ({"top_k": -(2**31) - 1}, r"sampling\.top_k = -2147483649 must be an int in \[-2\*\*31"),
    ({"top_logprobs": True}, r"sampling\.top_logprobs = True must be an int"),
    ({"stop_token_ids": (5, 2**40)}, r"sampling\.stop_token_ids\[1\] = 1099511627776 must be an int in"),
])
def test_a_sampling_value_the_wire_cannot_carry_is_refused_by_name(fields: dict, needle: str) -> None:
    sampling = SamplingParams(**{"max_new_tokens": 4, **fields})
    with pytest.raises(ValueError, match=needle):
        GenerateCall("s", [1, 2, 3], sampling)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"priority": 2**31}, r"priority = 2147483648 must be an int in \[-2\*\*31, 2\*\*31 - 1\]"),
    ({"timeout_s": 0.0}, r"timeout_s = 0\.0 must be finite and > 0"),
    ({"timeout_s": float("nan")}, r"timeout_s = nan must be finite and > 0"),
])
def test_a_call_value_out_of_range_is_refused_by_name(fields: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        GenerateCall("s", [1, 2, 3], **fields)


def test_values_at_the_wires_bounds_and_numpy_integers_are_taken() -> None:
    sampling = SamplingParams(
        max_new_tokens=np.int64(2**31 - 1), top_k=-(2**31), seed=np.uint64(2**64 - 1), stop_token_ids=(0, 2**31 - 1)
    )
    assert GenerateCall("s", [1], sampling, priority=-(2**31), timeout_s=0.5).sampling is sampling
    assert GenerateCall("s", [1], SamplingParams(max_new_tokens=4, seed=0)).sampling.seed == 0
