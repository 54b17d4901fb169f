"""The request of each generate attempt: built from the caller's domain call, never modifying it, and the prompt
on the wire exactly the caller's ids, whatever container they came in."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import pytest

from agentloop_grpc.common import wire
from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.common.types import FinishReason, SamplingParams, StructuredOutput
from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.router.attempts import attempt_request, ended_before_resume, resume_seed
from agentloop_grpc.v1 import generation_pb2

from .conftest import address, fake_servers
from .test_routing import FAST, params


def _ids(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def _request(call: GenerateCall, received: Sequence[int] = (), options=None, request_id: str = "r"):
    request = generation_pb2.GenerateRequest()
    attempt_request(request_id, call, wire.prompt_to_raw(call.prompt_ids), list(received), options, into=request)
    return request


def test_first_attempt_carries_the_call_as_given() -> None:
    sampling = SamplingParams(max_new_tokens=5, temperature=0.5, stop_token_ids=(7,), seed=3)
    request = _request(GenerateCall("s", [1, 2, 3], sampling, priority=2))
    assert _ids(request.prompt_ids_raw) == [1, 2, 3] and not request.prompt_ids  # the raw form only: cheaper
    expected = generation_pb2.SamplingParams(
        max_new_tokens=5, temperature=0.5, top_p=1.0, top_k=-1, repetition_penalty=1.0, seed=3, stop_token_ids=[7]
    )
    assert request.sampling_params == expected
    assert not request.HasField("structured_output")
    assert not request.HasField("stream_options")  # unset: every token as decoded
    assert (request.request_id, request.session_id, request.priority) == ("r", "s", 2)


def test_no_sampling_leaves_every_field_to_the_server() -> None:
    request = _request(GenerateCall("s", [1]))
    assert request.HasField("sampling_params")
    assert not request.sampling_params.HasField("max_new_tokens")  # unset stays unset: the engine's default
    assert not request.sampling_params.HasField("temperature") and not request.sampling_params.HasField("seed")


def test_resumed_attempt_asks_only_for_the_remaining_budget_and_leaves_the_call_alone() -> None:
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0, seed=7)
    call = GenerateCall("s", [1, 2, 3], sampling, StructuredOutput("regex", "[a-z]+"))
    grouped = generation_pb2.StreamOptions(min_chunk_tokens=16)
    assert _request(call, [], grouped, "r").structured_output.regex == "[a-z]+"
    request = _request(call, [40, 41], grouped, "r.2")  # a failover: the same seed
    assert request.sampling_params.max_new_tokens == 8
    assert _ids(request.prompt_ids_raw) == [1, 2, 3, 40, 41]
    assert request.sampling_params.HasField("temperature") and request.sampling_params.seed == 7
    # one rule for every continuation (failover or resumed abort): a grammar cannot resume mid-way, so it is not sent
    assert not request.HasField("structured_output")
    assert request.stream_options.min_chunk_tokens == 16
    assert call.sampling.max_new_tokens == 10 and list(call.prompt_ids) == [1, 2, 3]


def test_each_resumed_abort_has_a_seed_of_its_own_and_a_seedless_call_stays_seedless() -> None:
    call = GenerateCall("s", [1], SamplingParams(max_new_tokens=10, seed=7))
    seeds = []
    for resume in (1, 2, 1):
        request = generation_pb2.GenerateRequest()
        attempt_request("r", call, wire.prompt_to_raw([1]), [5], None, request, resume=resume)
        seeds.append(request.sampling_params.seed)
    assert seeds[0] == seeds[2] == resume_seed(7, 1) and len({7, *seeds}) == 3  # repeatable, and each its own
    unseeded = generation_pb2.GenerateRequest()
    attempt_request("r", GenerateCall("s", [1], SamplingParams(max_new_tokens=10)), wire.prompt_to_raw([1]), [5],
                    None, unseeded, resume=2)
    assert not unseeded.sampling_params.HasField("seed")


def test_int32_containers_go_as_their_bytes_and_other_ids_are_packed() -> None:
    assert wire.prompt_to_raw(PromptIds([5, -1, 7])) == struct.pack("<3i", 5, -1, 7)
    assert _ids(wire.prompt_to_raw(array("i", [5, -1, 7]))) == [5, -1, 7]
    assert _ids(wire.prompt_to_raw(array("q", [5, 6]))) == [5, 6]  # not int32: packed id by id
    assert _ids(wire.prompt_to_raw(range(3))) == [0, 1, 2]
    assert _ids(wire.prompt_to_raw((1, -1))) == [1, -1]  # int32: the server names a negative id


def test_ids_outside_int32_are_refused() -> None:
    with pytest.raises(ValueError):
        wire.prompt_to_raw([1, 2**31])


def test_tokens_received_before_a_failure_may_already_end_the_generation() -> None:
    sampling = SamplingParams(max_new_tokens=4, stop_token_ids=(9,))
    assert ended_before_resume([], sampling, (2,)) is None
    assert ended_before_resume([1, 9], sampling, (2,)) == (FinishReason.STOP, 9)
    assert ended_before_resume([1, 2], sampling, (2,)) == (FinishReason.STOP, 2)  # the resuming server's eos
    assert ended_before_resume([1, 2], SamplingParams(max_new_tokens=4, ignore_eos=True), (2,)) is None
    assert ended_before_resume([1, 1, 1, 1], sampling, None) == (FinishReason.LENGTH, None)
    assert ended_before_resume([1, 1, 1, 1], None, None) is None  # no budget known: the server's


@pytest.mark.parametrize("unary", [True, False])
async def test_every_prompt_form_gives_the_same_generation(unary: bool) -> None:
    sampling = params(8, temperature=0, logprobs=True)
    ids = [5, 6, 7, 8]
    config = FAST.model_copy(update={"unary_generate": unary})
    async with fake_servers(1) as servers, Router([address(servers[0])], config) as router:
        await router.fleet.wait_ready()
        expected = await router.generate(GenerateCall("fresh", list(ids), sampling))
        for session, prompt in [
            ("a", ids), ("b", tuple(ids)), ("c", PromptIds(ids)), ("d", array("i", ids)), ("e", iter(ids)),
        ]:
            result = await router.generate(GenerateCall(session, prompt, sampling))
            assert result.token_ids == expected.token_ids and result.logprobs == expected.logprobs, session
            assert result.prompt_tokens == 4
        turn = array("i", ids)  # an agent loop's growing context: each turn's prompt is the array as it is now
        await router.generate(GenerateCall("multi", turn, sampling))
        turn.extend([10, 11])
        longer = await router.generate(GenerateCall("multi", turn, sampling))
        fresh = await router.generate(GenerateCall("fresh2", [5, 6, 7, 8, 10, 11], sampling))
        assert longer.token_ids == fresh.token_ids
        assert longer.prompt_tokens == 6


async def test_request_ids_are_unique_per_router() -> None:
    routers = [Router([], RouterConfig()) for _ in range(2)]
    ids = {router._new_request_id() for router in routers for _ in range(100)}
    assert len(ids) == 200
