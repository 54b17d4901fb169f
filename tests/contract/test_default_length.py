"""Contract: a Generate that sets no max_new_tokens gets the server's default length (reported by GetServerInfo),
capped by the room left under max_model_len. The fake serves the default config's length; the real engines a
shorter one (conftest), which they decode on a CPU."""

from __future__ import annotations

import pytest

from agentloop_grpc.engine_adapters.config_base import DEFAULT_MAX_NEW_TOKENS
from agentloop_grpc.v1 import generation_pb2

from .target import ContractTarget, collect, request

LENGTH = generation_pb2.FINISH_REASON_LENGTH


async def test_no_max_new_tokens_generates_the_reported_default(engine: ContractTarget) -> None:
    info = await engine.info()
    assert info.default_max_new_tokens > 0
    if engine.name == "fake":
        assert info.default_max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    result = await collect(engine, request(engine, ignore_eos=True, temperature=0))
    assert result.complete.finish_reason == LENGTH
    assert result.complete.completion_tokens == len(result.tokens) == info.default_max_new_tokens


# The servicer resolves the length before any adapter sees the request: one adapter shows the cap, and the fake
# spares the real engines a prefill of a whole context on a CPU.
@pytest.mark.parametrize("engine_target", ["fake"], indirect=True)
async def test_the_default_is_capped_by_the_room_left(engine: ContractTarget) -> None:
    info = await engine.info()
    room = 5
    prompt = (engine.prompt * info.max_model_len)[: info.max_model_len - room]
    result = await collect(engine, request(engine, prompt=prompt, ignore_eos=True, temperature=0))
    assert result.complete.finish_reason == LENGTH and result.complete.completion_tokens == room
