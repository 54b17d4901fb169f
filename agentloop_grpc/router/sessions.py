"""StickySessions: where each live session's requests go, for affinity (its prefix cache stays on one server), and
where each live GRPO group's sessions are, for group affinity (its prompt is prefilled once per group and server).

A session is remembered from its first request until its trajectory ends (``close``: the loops and the gateway say
so), until it sits idle past ``ttl_s`` (a caller that never says: a custom loop, a crashed worker), or until
``max_sessions`` newer ones push it out, so the table's memory is bounded whatever runs through it. Entries are kept
in last-use order, so expiry and eviction look only at the oldest: O(1) amortized per request. A group is known
only while one of its sessions is: its count per server falls as they leave, and it is forgotten with the last.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

_NO_SERVERS: Mapping[str, int] = {}


class StickySessions:
    """Session id -> server address (and group), bounded in count and idle time (see the module docstring)."""

    def __init__(self, max_sessions: int, ttl_s: float) -> None:
        self._max, self._ttl = max_sessions, ttl_s
        self._entries: OrderedDict[str, tuple[str, float, str]] = OrderedDict()  # address, last use, group
        self._groups: dict[str, dict[str, int]] = {}  # group -> address -> its live sessions there

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def live_groups(self) -> int:
        return len(self._groups)

    def get(self, session_id: str) -> str | None:
        entry = self._entries.get(session_id)
        return None if entry is None else entry[0]

    def group_servers(self, group_id: str) -> Mapping[str, int]:
        """The servers holding live sessions of ``group_id``, and how many each."""
        return self._groups.get(group_id, _NO_SERVERS) if group_id else _NO_SERVERS

    def remember(self, session_id: str, address: str, now: float, group_id: str = "") -> None:
        """The session's request went to ``address`` at ``now`` (monotonic seconds); the oldest expire."""
        entries = self._entries
        previous = entries.get(session_id)
        entries[session_id] = (address, now, group_id)
        entries.move_to_end(session_id)
        if previous is None or previous[0] != address or previous[2] != group_id:
            if previous is not None:
                self._forget(previous)
            if group_id:
                servers = self._groups.setdefault(group_id, {})
                servers[address] = servers.get(address, 0) + 1
        while len(entries) > self._max:
            self._forget(entries.popitem(last=False)[1])
        while entries:
            _, (_, last, _) = next(iter(entries.items()))
            if now - last <= self._ttl:
                break
            self._forget(entries.popitem(last=False)[1])

    def close(self, session_id: str) -> str | None:
        """The session's trajectory ended: forget it (a later request places it anew); returns its server."""
        entry = self._entries.pop(session_id, None)
        if entry is None:
            return None
        self._forget(entry)
        return entry[0]

    def _forget(self, entry: tuple[str, float, str]) -> None:
        if entry[2]:
            self._leave(entry[2], entry[0])

    def _leave(self, group_id: str, address: str) -> None:
        servers = self._groups.get(group_id)
        if servers is None:
            return
        left = servers.get(address, 0) - 1
        if left > 0:
            servers[address] = left
        else:
            servers.pop(address, None)
            if not servers:
                del self._groups[group_id]
