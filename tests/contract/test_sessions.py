"""Contract: EndSessions (an ended trajectory's cached blocks may go first), GetLoad's preemptions, and prefix caches
across a weight update (a prompt is never served KV of the weights before)."""

from __future__ import annotations

import itertools

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from .target import ContractTarget, StreamWatcher, collect, request

#: Whether the engine can demote a session's blocks; vLLM and SGLang cannot, and answer 0 (their adapters say why).
DEMOTES = {"fake": True, "embedded": True, "vllm": False, "sglang": False}
#: Whether a FlushCache preempts a running request: vLLM's reset takes the running requests' blocks.
FLUSH_PREEMPTS = {"fake": False, "embedded": False, "vllm": True, "sglang": False}
_sessions = itertools.count()


def _prompt(seed: int) -> list[int]:
    """200 ids: whole blocks for every engine's block size."""
    return [(seed * 31 + 7 * i) % 1000 + 3 for i in range(200)]


async def _run(engine: ContractTarget, prompt: list[int], session: str = "") -> generation_pb2.GenerateComplete:
    req = request(engine, prompt=prompt, max_new_tokens=4, ignore_eos=True, temperature=0)
    req.session_id = session
    return (await collect(engine, req)).complete


async def _end(engine: ContractTarget, *session_ids: str) -> int:
    answer = await engine.generate.EndSessions(generation_pb2.EndSessionsRequest(session_ids=session_ids), timeout=10)
    return answer.demoted_blocks


async def test_end_sessions_demotes_an_ended_sessions_blocks_but_none_a_live_session_holds(
    engine: ContractTarget,
) -> None:
    first, second = (f"{engine.name}-session-{next(_sessions)}" for _ in range(2))
    prompt = _prompt(next(_sessions))
    await _run(engine, prompt, first)
    await _run(engine, prompt, second)  # a GRPO sibling: the same prompt and, greedy, the same reply
    assert await _end(engine, first, "never-seen") == 0  # the sibling holds every block the first left
    demoted = await _end(engine, second)
    assert demoted > 0 if DEMOTES[engine.name] else demoted == 0
    assert await _end(engine, second) == 0  # an ended session is forgotten
    assert (await _run(engine, prompt)).prompt_tokens == len(prompt)  # a hint: the server serves on


@pytest.mark.parametrize(
    ("session_ids", "needles"),
    [
        ([f"s{i}" for i in range(1025)], ("session_ids", "1025", "1024")),
        (["ok", "x" * 257], ("session_ids[1]", "257", "256")),
        (["ok", ""], ("session_ids[1]", "empty")),
    ],
    ids=["too-many", "too-long", "empty"],
)
async def test_end_sessions_bounds_are_invalid_argument(
    engine: ContractTarget, session_ids: list[str], needles: tuple[str, ...]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await engine.generate.EndSessions(generation_pb2.EndSessionsRequest(session_ids=session_ids), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert all(needle in error.value.details() for needle in needles), error.value.details()
    assert await _end(engine, *[f"s{i}" for i in range(1024)]) == 0  # the bound itself is fine
    assert (await _run(engine, engine.prompt)).prompt_tokens == len(engine.prompt)


async def test_preemptions_count_what_the_engine_preempted(engine: ContractTarget) -> None:
    before = (await engine.load()).preemptions
    watcher = StreamWatcher(engine, request(engine, max_new_tokens=engine.long_tokens // 4, ignore_eos=True))
    await watcher.first_tokens()
    await engine.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    await watcher.result()
    after = (await engine.wait_no_requests()).preemptions
    assert after - before >= 1 if FLUSH_PREEMPTS[engine.name] else after == before


async def test_an_update_without_flush_never_serves_the_old_weights_cache(engine: ContractTarget) -> None:
    prompt = _prompt(next(_sessions))
    cold = await collect(engine, request(engine, prompt=prompt, max_new_tokens=4, ignore_eos=True, temperature=0))
    assert (await _run(engine, prompt)).cached_prompt_tokens > 0
    await engine.reload_same_weights()  # flush_cache false
    after = await collect(engine, request(engine, prompt=prompt, max_new_tokens=4, ignore_eos=True, temperature=0))
    assert after.complete.cached_prompt_tokens == 0  # the blocks of before are not this version's
    assert after.tokens == cold.tokens  # the same values were loaded: the same tokens
    assert (await _run(engine, prompt)).cached_prompt_tokens > 0  # the new version's blocks hit
