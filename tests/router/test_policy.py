"""The routing policy as pure functions: least-loaded placement, stickiness, bounded imbalance, hashing; group,
prefix and KV-pressure hints (cache_aware); the anchors (round-robin, least-loaded per request, consistent hash)."""

from __future__ import annotations

import hashlib

import pytest

from agentloop_grpc.router import RouterConfig
from agentloop_grpc.router.config import Placement
from agentloop_grpc.router.policy import Decision, Hints, choose_server

CONFIG = RouterConfig(imbalance_ratio=2.0, imbalance_min_gap=4)


def test_new_session_goes_to_least_loaded() -> None:
    assert choose_server("s", None, {"a": 5, "b": 1, "c": 3}, CONFIG) == ("b", Decision.NEW)


def test_ties_spread_sessions_by_hash() -> None:
    chosen = {choose_server(f"s{i}", None, {"a": 0, "b": 0, "c": 1}, CONFIG)[0] for i in range(50)}
    assert chosen == {"a", "b"}
    assert choose_server("s7", None, {"b": 0, "a": 0}, CONFIG) == choose_server("s7", None, {"a": 0, "b": 0}, CONFIG)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({"a": 4, "b": 0}, ("a", Decision.STICKY)),  # gap 4 is within imbalance_min_gap
        ({"a": 9, "b": 5}, ("a", Decision.STICKY)),  # gap 4 again; and 9 < 2 x 5
        ({"a": 11, "b": 6}, ("a", Decision.STICKY)),  # gap 5 > 4 but 11 < 2 x 6: not imbalanced enough
        ({"a": 13, "b": 6}, ("b", Decision.MOVED)),  # gap 7 > 4 and 13 > 2 x 6
        ({"a": 5, "b": 0}, ("b", Decision.MOVED)),
    ],
)
def test_sticky_within_bounded_imbalance(loads, expected) -> None:
    assert choose_server("s", "a", loads, CONFIG) == expected


def test_session_on_unhealthy_server_moves() -> None:
    assert choose_server("s", "gone", {"a": 3, "b": 1}, CONFIG) == ("b", Decision.MOVED)


def test_deterministic_mode_ignores_load_and_is_stable() -> None:
    config = RouterConfig(placement="consistent_hash")
    servers = {f"10.0.0.{i}:1": 0 for i in range(4)}
    placement = {f"s{i}": choose_server(f"s{i}", None, servers, config)[0] for i in range(200)}
    assert len(set(placement.values())) == 4  # spread over every server
    loaded = {address: 100 * i for i, address in enumerate(servers)}
    for session, address in placement.items():
        assert choose_server(session, address, loaded, config) == (address, Decision.STICKY)
    # removing one server moves only the sessions that were on it
    smaller = dict.fromkeys(list(servers)[:-1], 0)
    moved = [s for s, a in placement.items() if choose_server(s, a, smaller, config)[0] != a]
    assert moved and all(placement[s] == list(servers)[-1] for s in moved)


def test_empty_is_an_error() -> None:
    with pytest.raises(ValueError):
        choose_server("s", None, {}, CONFIG)


def _reference(session_id: str, current: str | None, loads: dict[str, int], config: RouterConfig) -> str:
    """The documented rule, spelled out without shortcuts: the least loaded (hash among ties) unless the session's
    server is within the bounded imbalance."""
    lowest = min(loads.values())
    tied = sorted(a for a, load in loads.items() if load == lowest)
    least = tied[int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest()) % len(tied)]
    if current in loads:
        gap = loads[current] - lowest
        if not (gap > config.imbalance_min_gap and loads[current] > config.imbalance_ratio * lowest):
            return current
    return least


@pytest.mark.parametrize("current", [None, "a", "b", "c", "gone"])
def test_choice_matches_the_documented_rule_over_a_grid_of_loads(current) -> None:
    for a in range(0, 20, 3):
        for b in range(0, 20, 4):
            for c in (0, 5, 17):
                loads = {"a": a, "b": b, "c": c}
                for session in ("s1", "s2", "s3"):
                    chosen, decision = choose_server(session, current, loads, CONFIG)
                    assert chosen == _reference(session, current, loads, CONFIG), (loads, current, session)
                    expected = Decision.NEW if current is None else (
                        Decision.STICKY if chosen == current else Decision.MOVED
                    )
                    assert decision is expected


def _new(loads: dict[str, int], **hints) -> str:
    return choose_server("s", None, loads, CONFIG, Hints(**hints))[0]


def test_a_group_stays_on_its_server_within_the_imbalance_bound() -> None:
    assert _new({"a": 3, "b": 0}, group={"a": 3}) == "a"  # gap 3 is within imbalance_min_gap 4
    assert _new({"a": 4, "b": 0, "c": 0}, group={"a": 4}) == "a"


def test_a_group_too_large_for_one_server_spills_onto_the_fewest_others() -> None:
    # a is overloaded (gap 10 > 4, 10 > 2 x 0): the group goes on to the least-loaded server
    assert _new({"a": 10, "b": 0, "c": 0, "d": 1}, group={"a": 10}) in {"b", "c"}
    # once it spilled to b, it keeps to b rather than opening a third server, though c is less loaded
    assert _new({"a": 10, "b": 3, "c": 0}, group={"a": 10, "b": 3}) == "b"
    # of two servers within the bound, the one holding more of the group
    assert _new({"a": 4, "b": 1, "c": 0}, group={"a": 4, "b": 1}) == "a"


def test_a_group_never_overrides_the_bound_and_a_new_group_goes_least_loaded() -> None:
    assert _new({"a": 13, "b": 6}, group={"a": 13}) == "b"
    assert _new({"a": 2, "b": 0}, group={}) == "b"


def test_a_new_session_goes_where_its_prompt_prefix_is_cached_while_that_outweighs_the_load() -> None:
    # CONFIG: blocks of 64 tokens, one request of load per 512 tokens held beyond the least-loaded server's
    assert _new({"a": 0, "b": 2, "c": 3}, prefix={"b": 16, "c": 32}) == "c"  # 2,048 tokens: 3 over is within 4
    assert _new({"a": 0, "b": 1, "c": 1}, prefix={"b": 20, "c": 20}) == "b"  # equal prefixes: a tie, by address
    assert _new({"a": 0, "b": 2}, prefix={"b": 8}) == "a"  # 512 tokens are worth one request, not two
    assert _new({"a": 0, "b": 1}, prefix={"b": 8}) == "b"
    assert _new({"a": 0, "b": 2}, prefix={"b": 0}) == "a"
    # only what it holds beyond the least-loaded server counts: a system prompt both hold weighs nothing
    assert _new({"a": 0, "b": 1}, prefix={"a": 8, "b": 9}) == "a"
    assert _new({"a": 0, "b": 1}, prefix={"a": 8, "b": 16}) == "b"
    assert _new({"a": 0, "b": 9}, prefix={"b": 500}) == "a"  # b is overloaded: no prefix outweighs that
    # the group outweighs a prefix (the group's server holds the same prompt and its siblings' turns)
    assert _new({"a": 1, "b": 1}, group={"a": 1}, prefix={"b": 30}) == "a"


def test_servers_under_kv_pressure_take_no_new_session_while_another_can() -> None:
    assert _new({"a": 0, "b": 5}, pressured={"a"}) == "b"
    assert _new({"a": 0, "b": 1}, group={"a": 1}, pressured={"a"}) == "b"
    assert _new({"a": 0, "b": 1}, pressured={"a", "b"}) == "a"  # all pressured: placed anyway (after the wait)
    # a session already there stays: its KV is there, and it frees memory as it ends
    assert choose_server("s", "a", {"a": 1, "b": 0}, CONFIG, Hints(pressured={"a"})) == ("a", Decision.STICKY)


def test_the_anchor_placements() -> None:
    loads = {"a": 0, "b": 5, "c": 1}
    round_robin = RouterConfig(placement=Placement.ROUND_ROBIN)
    picks = [choose_server("s", "b", loads, round_robin, sequence=i)[0] for i in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]  # every request to the next server, stickiness ignored
    least = RouterConfig(placement="least_loaded")
    assert choose_server("s", "c", loads, least) == ("a", Decision.MOVED)  # no stickiness, however small the gap
    sticky = RouterConfig(placement="sticky_least_loaded", imbalance_min_gap=4)
    # the previous default ignores groups, prefixes and pressure
    assert choose_server("s", None, loads, sticky, Hints(group={"c": 1}, prefix={"c": 9}, pressured={"a"}))[0] == "a"


def test_a_config_copied_with_a_plain_string_places_as_its_enum_would() -> None:
    copied = RouterConfig().model_copy(update={"placement": "round_robin"})  # model_copy does not validate
    loads = {"a": 0, "b": 5, "c": 1}
    assert [choose_server("s", None, loads, copied, sequence=i)[0] for i in range(3)] == ["a", "b", "c"]
    copied = RouterConfig(placement="round_robin").model_copy(update={"placement": "cache_aware"})
    assert choose_server("s", None, {"a": 3, "b": 0}, copied, Hints(group={"a": 3}))[0] == "a"
