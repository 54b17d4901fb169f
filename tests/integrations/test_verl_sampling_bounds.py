"""verl's sampling dict refuses, by name, a value the request could not carry or the engines never take: verl
passes its seed through unchecked, and a negative one used to leak a stream slot of the Router for good."""

from __future__ import annotations

import pytest

from agentloop_grpc.integrations.verl.sampling import sampling_from_verl


@pytest.mark.parametrize(("params", "needle"), [
    ({"seed": -1}, r"verl sampling params: seed = -1 must be an int in \[0, 2\*\*64 - 1\]"),
    ({"seed": 2**64}, r"verl sampling params: seed = 18446744073709551616 must be an int in \[0, 2\*\*64 - 1\]"),
    ({"max_tokens": 2**31}, r"verl sampling params: max_new_tokens = 2147483648 must be an int in \[-2\*\*31"),
    ({"top_k": 2**32}, r"verl sampling params: top_k = 4294967296 must be an int in"),
    ({"stop_token_ids": [7, -(2**33)]}, r"verl sampling params: stop_token_ids\[1\] = -8589934592 must be an int"),
    ({"temperature": float("nan")}, r"verl sampling param 'temperature' = nan must be finite"),
    ({"top_p": float("inf")}, r"verl sampling param 'top_p' = inf must be finite"),
    ({"repetition_penalty": float("-inf")}, r"verl sampling param 'repetition_penalty' = -inf must be finite"),
])
def test_a_verl_sampling_value_out_of_range_is_refused_by_name(params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        sampling_from_verl(params, 16)


def test_the_largest_seed_is_taken() -> None:
    assert sampling_from_verl({"seed": 2**64 - 1, "temperature": 0.5}, 16).seed == 2**64 - 1
