"""Prompts on the wire: int32 bytes taken as they are (PromptIds, array('i')), and a session's next prompt that
extends its last one packed only in its new part, exactly (a caller's list mutated in between is sent as it is
now), in bounded memory."""

from __future__ import annotations

import struct
from array import array

import pytest

from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.router import Router, RouterConfig
from agentloop_grpc.router.prompts import PromptPacker, extended, prompt_length

from .conftest import address, fake_servers
from .test_routing import FAST, params


def _ids(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def test_int32_containers_go_as_their_bytes() -> None:
    packer = PromptPacker(max_ids=100)
    assert packer.pack("s", PromptIds([5, -1, 7])) == struct.pack("<3i", 5, -1, 7)
    assert _ids(packer.pack("s", array("i", [5, -1, 7]))) == [5, -1, 7]
    assert _ids(packer.pack("s", array("q", [5, 6]))) == [5, 6]  # not int32: packed id by id
    assert _ids(packer.pack("s", range(3))) == [0, 1, 2]


def test_the_next_prompt_is_exact_whatever_the_caller_did_to_its_list() -> None:
    packer = PromptPacker(max_ids=100)
    prompt = [1, 2, 3]
    assert _ids(packer.pack("s", prompt)) == [1, 2, 3]
    prompt += [4, 5]  # the next turn extends the last one: only [4, 5] is packed
    assert _ids(packer.pack("s", prompt)) == [1, 2, 3, 4, 5]
    prompt[1] = 20  # mutated in place: the remembered prefix no longer matches
    assert _ids(packer.pack("s", prompt)) == [1, 20, 3, 4, 5]
    assert _ids(packer.pack("s", [1, 20])) == [1, 20]  # shorter
    assert _ids(packer.pack("s", (1, 20, 9))) == [1, 20, 9]  # a tuple extending a list
    assert _ids(packer.pack("other", [1, 20, 9, 10])) == [1, 20, 9, 10]  # sessions are apart
    assert packer.pack("s", [1, 20, 9, 2**31]) == [1, 20, 9, 2**31]  # outside int32: the ids, for the repeated field
    assert _ids(packer.pack("s", [1, 20, 9])) == [1, 20, 9]


def test_memory_stays_within_max_ids() -> None:
    packer = PromptPacker(max_ids=10)
    for session in range(5):
        packer.pack(f"s{session}", [session] * 4)
    assert packer._held <= 10 and list(packer._known) == ["s3", "s4"]  # least recently used forgotten first
    packer.pack("big", list(range(11)))  # longer than the bound: never remembered
    assert packer._held <= 10 and "big" not in packer._known
    packer.forget("s4")
    assert packer._held == 4 and list(packer._known) == ["s3"]
    assert _ids(PromptPacker(max_ids=0).pack("s", [1, 2])) == [1, 2]


def test_resumed_prompts_append_the_received_tokens() -> None:
    raw = struct.pack("<2i", 1, 2)
    assert _ids(extended(raw, [3, 4])) == [1, 2, 3, 4] and extended(raw, []) is raw
    assert extended([1, 2**31], [3]) == [1, 2**31, 3]
    assert prompt_length(raw) == prompt_length([1, 2]) == 2


@pytest.mark.parametrize("unary", [True, False])
async def test_every_prompt_form_gives_the_same_generation(unary: bool) -> None:
    sampling = params(8, temperature=0, logprobs=True)
    ids = [5, 6, 7, 8]
    config = FAST.model_copy(update={"unary_generate": unary})
    async with fake_servers(1) as servers, Router([address(servers[0])], config) as router:
        await router.wait_ready()
        expected = await router.generate("fresh", list(ids), sampling)
        for session, prompt in [
            ("a", ids), ("b", tuple(ids)), ("c", PromptIds(ids)), ("d", array("i", ids)), ("e", iter(ids)),
        ]:
            result = await router.generate(session, prompt, sampling)
            assert result.token_ids == expected.token_ids and result.logprobs == expected.logprobs, session
            assert result.prompt_tokens == 4
        turn = list(ids)
        await router.generate("multi", turn, sampling)
        turn[0] = 9  # the remembered prompt must not be reused for this one
        changed = await router.generate("multi", turn, sampling)
        assert changed.token_ids == (await router.generate("fresh2", [9, 6, 7, 8], sampling)).token_ids
        turn += [10, 11]
        longer = await router.generate("multi", turn, sampling)
        assert longer.token_ids == (await router.generate("fresh3", [9, 6, 7, 8, 10, 11], sampling)).token_ids
        assert longer.prompt_tokens == 6


async def test_request_ids_are_unique_per_router() -> None:
    routers = [Router([], RouterConfig()) for _ in range(2)]
    ids = {router._new_request_id() for router in routers for _ in range(100)}
    assert len(ids) == 200
