"""SessionBlocks (what EndSessions demotes) and ``demote``, on plain block keys."""

from __future__ import annotations

from collections import OrderedDict

from agentloop_grpc.engine_adapters.session_blocks import SessionBlocks, demote


def test_ending_a_session_releases_only_the_blocks_no_live_session_holds() -> None:
    sessions = SessionBlocks(max_held=100)
    sessions.note("a", [1, 2, 3, 4])  # a GRPO sample: the group's prompt (1, 2), then its own reply
    sessions.note("b", [1, 2, 5])
    assert sessions.end(["a", "unknown"]) == [3, 4]
    assert sessions.end(["a"]) == []  # forgotten once ended
    assert sessions.end(["b"]) == [1, 2, 5]  # the last holder of the prompt ended
    assert len(sessions) == 0 and sessions.held == 0


def test_a_sessions_next_request_replaces_what_it_held() -> None:
    sessions = SessionBlocks(max_held=100)
    sessions.note("a", [1, 2])
    sessions.note("a", [1, 2, 3])  # the next turn extends the chain
    sessions.note("b", [7])
    sessions.note("b", [8])  # another chain altogether: 7 is no longer b's
    assert sessions.end(["a", "b"]) == [1, 2, 3, 8]
    sessions.note("", [9])  # a request without a session is not tracked
    assert len(sessions) == 0


def test_an_evicted_block_leaves_every_entry_and_an_empty_entry_is_forgotten() -> None:
    sessions = SessionBlocks(max_held=100)
    sessions.note("a", [1, 2])
    sessions.note("b", [1])
    sessions.evicted(1)
    assert len(sessions) == 1 and sessions.held == 1  # b held only 1
    sessions.evicted(2)
    assert len(sessions) == 0 and sessions.held == 0
    sessions.evicted(3)  # never held: nothing to do


def test_memory_stays_bounded_however_many_sessions_run() -> None:
    sessions = SessionBlocks(max_held=50)
    for index in range(100_000):  # sessions that never end
        sessions.note(f"s{index}", [3 * index, 3 * index + 1, 3 * index + 2])
    assert sessions.held == 48 and len(sessions) == 16  # the least recently active were forgotten
    assert sessions.end(["s0"]) == [] and sessions.end(["s99999"]) == [299_997, 299_998, 299_999]


def test_demote_moves_each_chains_tail_to_the_front_first() -> None:
    cache = OrderedDict.fromkeys([10, 11, 1, 2, 3, 12])  # least recently used first
    assert demote(cache, [1, 2, 3, 99]) == 3  # 99: no longer cached
    assert list(cache) == [3, 2, 1, 10, 11, 12]  # evicted first: the tail, so what stays is a prefix
