"""A loop's sampling config (the rollout's and TRL's ``loop.sampling``, a Sample's own) refuses, by name when it is
loaded, a value the request could not carry or no engine takes: before, a negative seed passed the config and
failed every trajectory's first generate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentloop_grpc.agent.config import SEED_MAX, SamplingConfig


@pytest.mark.parametrize(("fields", "needle"), [
    ({"seed": -1}, r"seed\n  Input should be greater than or equal to 0"),
    ({"seed": 2**64}, r"seed\n  Input should be less than or equal to 9223372036854775807"),
    ({"top_k": 2**31}, r"top_k\n  Input should be less than or equal to 2147483647"),
    ({"stop_token_ids": (3, -1)}, r"stop_token_ids\.1\n  Input should be greater than or equal to 0"),
    ({"stop_token_ids": (2**31,)}, r"stop_token_ids\.0\n  Input should be less than or equal to 2147483647"),
    ({"temperature": float("nan")}, r"temperature\n  Input should be a finite number"),
    ({"repetition_penalty": float("inf")}, r"repetition_penalty\n  Input should be a finite number"),
])
def test_a_sampling_value_out_of_range_is_refused_by_name(fields: dict, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        SamplingConfig(**fields)


def test_the_largest_seed_wraps_into_the_engines_range() -> None:
    params = SamplingConfig(seed=SEED_MAX).params(8, seed_offset=3)
    assert params.seed == 2 and 0 <= params.seed <= SEED_MAX
