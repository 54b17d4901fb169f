"""The Router's session table: bounded in count and idle time, so a million sessions leave its memory flat; and
the loops and the gateway release their sessions when their trajectories end."""

from __future__ import annotations

from agentloop_grpc.router.sessions import StickySessions


def test_ended_sessions_are_forgotten_and_idle_ones_expire():
    table = StickySessions(max_sessions=3, ttl_s=10.0)
    table.remember("a", "s1", now=0.0)
    table.remember("b", "s2", now=1.0)
    assert (table.get("a"), table.get("b"), len(table)) == ("s1", "s2", 2)
    table.close("a")
    assert table.get("a") is None and len(table) == 1
    table.remember("b", "s2", now=9.0)  # used again: it stays
    table.remember("c", "s1", now=15.0)  # nothing idle past 10 s yet (b was used at 9)
    assert len(table) == 2
    table.remember("d", "s2", now=19.5)  # b idle 10.5 s: expired
    assert table.get("b") is None and len(table) == 2
    for i, name in enumerate("efgh"):  # past max_sessions the least recently used go first
        table.remember(name, "s1", now=20.0 + i)
    assert len(table) == 3 and table.get("h") == "s1" and table.get("c") is None
    table.close("nobody")  # closing an unknown session is harmless


def test_a_million_sessions_leave_memory_flat():
    """1,000,000 trajectories, 64 in flight at a time, each closing its session as loops do, and every tenth never
    closed (a crashed worker): the table ends as small as it was after the first thousand, however many ran."""
    table = StickySessions(max_sessions=100_000, ttl_s=60.0)
    now, sizes = 0.0, []
    for i in range(1_000_000):
        now += 0.001  # 1000 trajectories a second: one left open lives 60 s, i.e. 60,000 trajectories
        table.remember(f"trajectory-{i}", f"server-{i % 256}", now)
        if i >= 64 and (i - 64) % 10:
            table.close(f"trajectory-{i - 64}")
        if i in (100_000, 999_999):
            sizes.append(len(table))
    # the open tenth of the last 60 s plus those in flight, the same after 100,000 trajectories as after 1,000,000
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= 6_100, sizes


def test_a_group_is_known_only_while_one_of_its_sessions_is():
    table = StickySessions(max_sessions=4, ttl_s=10.0)
    for i, server in enumerate(["s1", "s1", "s2"]):
        table.remember(f"g-{i}", server, now=0.0, group_id="g")
    table.remember("other", "s2", now=0.0)
    assert dict(table.group_servers("g")) == {"s1": 2, "s2": 1} and table.live_groups == 1
    table.remember("g-0", "s2", now=1.0, group_id="g")  # moved: counted where it is now
    assert dict(table.group_servers("g")) == {"s1": 1, "s2": 2}
    assert table.close("g-1") == "s1" and dict(table.group_servers("g")) == {"s2": 2}
    table.remember("g-2", "s2", now=20.0, group_id="g")  # g-0 and "other" idle past 10 s: expired
    assert dict(table.group_servers("g")) == {"s2": 1}
    for i in range(4):  # g-2 pushed out past max_sessions: the group goes with it
        table.remember(f"new-{i}", "s1", now=21.0, group_id="h")
    assert table.group_servers("g") == {} and table.live_groups == 1 and dict(table.group_servers("h")) == {"s1": 4}
    for i in range(4):
        table.close(f"new-{i}")
    assert table.live_groups == 0 and table.group_servers("") == {}


def test_a_million_grouped_sessions_leave_no_group_behind():
    """GRPO groups of 8 over 256 servers, every session closed as the loops do but every tenth group abandoned: the
    groups known are those of live sessions, as few after 1,000,000 sessions as after 100,000."""
    table = StickySessions(max_sessions=100_000, ttl_s=60.0)
    now, sizes = 0.0, []
    for i in range(1_000_000):
        now += 0.001
        group = i // 8
        table.remember(f"t-{i}", f"server-{group % 256}", now, group_id=f"group-{group}")
        if i >= 64 and ((i - 64) // 8) % 10:
            table.close(f"t-{i - 64}")
        if i in (100_000, 999_999):
            sizes.append((len(table), table.live_groups))
    assert sizes[0] == sizes[1] or abs(sizes[0][1] - sizes[1][1]) <= 2, sizes
    assert max(groups for _, groups in sizes) <= 800, sizes
