"""SessionTable: where each live session's requests go, for affinity (its prefix cache stays on one server).

A session is remembered from its first request until its trajectory ends (``close``: the loops and the gateway say
so), until it sits idle past ``ttl_s`` (a caller that never says: a custom loop, a crashed worker), or until
``max_sessions`` newer ones push it out, so the table's memory is bounded whatever runs through it. Entries are kept
in last-use order, so expiry and eviction look only at the oldest: O(1) amortized per request.
"""

from __future__ import annotations

from collections import OrderedDict


class SessionTable:
    """Session id -> server address, bounded in count and idle time (see the module docstring)."""

    def __init__(self, max_sessions: int, ttl_s: float) -> None:
        self._max, self._ttl = max_sessions, ttl_s
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, session_id: str) -> str | None:
        entry = self._entries.get(session_id)
        return None if entry is None else entry[0]

    def remember(self, session_id: str, address: str, now: float) -> None:
        """The session's request went to ``address`` at ``now`` (monotonic seconds); the oldest expire."""
        self._entries[session_id] = (address, now)
        self._entries.move_to_end(session_id)
        entries = self._entries
        while len(entries) > self._max:
            entries.popitem(last=False)
        while entries:
            _, (_, last) = next(iter(entries.items()))
            if now - last <= self._ttl:
                break
            entries.popitem(last=False)

    def close(self, session_id: str) -> None:
        """The session's trajectory ended: forget it (a later request places it anew)."""
        self._entries.pop(session_id, None)
