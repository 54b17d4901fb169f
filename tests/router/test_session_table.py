"""The Router's session table: bounded in count and idle time, so a million sessions leave its memory flat; and
the loops and the gateway release their sessions when their trajectories end."""

from __future__ import annotations

from agentloop_grpc.router.sessions import SessionTable


def test_ended_sessions_are_forgotten_and_idle_ones_expire():
    table = SessionTable(max_sessions=3, ttl_s=10.0)
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
    table = SessionTable(max_sessions=100_000, ttl_s=60.0)
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
