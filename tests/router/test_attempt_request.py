"""The request of each generate attempt: built without copying the caller's inputs, never modifying them."""

from __future__ import annotations

import struct

import pytest

from agentloop_grpc.router.attempts import attempt_request as _attempt_request
from agentloop_grpc.v1 import generation_pb2


def _prompt(request: generation_pb2.GenerateRequest) -> list[int]:
    raw = request.prompt_ids_raw
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def test_first_attempt_carries_the_params_as_given() -> None:
    params = generation_pb2.SamplingParams(temperature=0.5, stop_token_ids=[7])
    request = _attempt_request("r", "s", [1, 2, 3], params, 0, None, 2, None)
    assert _prompt(request) == [1, 2, 3] and not request.prompt_ids  # the raw form only: cheaper both ends
    assert request.sampling_params == params
    assert not request.sampling_params.HasField("max_new_tokens")  # unset stays unset: the engine's default
    assert not request.HasField("structured_output")
    assert not request.HasField("stream_options")  # unset: every token as decoded
    assert (request.request_id, request.session_id, request.priority) == ("r", "s", 2)


def test_resumed_attempt_asks_only_for_the_remaining_budget_and_leaves_the_callers_params_alone() -> None:
    params = generation_pb2.SamplingParams(max_new_tokens=10, temperature=0.0)
    structured = generation_pb2.StructuredOutput(regex="[a-z]+")
    grouped = generation_pb2.StreamOptions(min_chunk_tokens=16)
    request = _attempt_request("r.2", "s", [1, 2, 3, 40, 41], params, 2, structured, 0, grouped)
    assert request.sampling_params.max_new_tokens == 8
    assert _prompt(request) == [1, 2, 3, 40, 41]
    assert request.sampling_params.HasField("temperature")
    assert request.structured_output.regex == "[a-z]+"
    assert request.stream_options.min_chunk_tokens == 16
    assert params.max_new_tokens == 10


def test_the_request_owns_its_params() -> None:
    """The caller may reuse one SamplingParams for every call: a request must not alias it."""
    params = generation_pb2.SamplingParams(max_new_tokens=4)
    request = _attempt_request("r", "s", [1], params, 0, None, 0, None)
    params.max_new_tokens = 99
    assert request.sampling_params.max_new_tokens == 4


def test_ids_outside_int32_go_as_the_repeated_field_which_refuses_them() -> None:
    params = generation_pb2.SamplingParams()
    with pytest.raises(ValueError):
        _attempt_request("r", "s", [1, 2**31], params, 0, None, 0, None)
    negative = _attempt_request("r", "s", [1, -1], params, 0, None, 0, None)  # int32: the server names it
    assert _prompt(negative) == [1, -1]
