"""Where a session's next request goes: a pure function, so the policy is testable without servers.

Least-loaded placement for new sessions (ties broken by a hash of the session id, so sessions spread even
when nothing is in flight); stickiness afterwards, because the previous turn's KV sits in that
server's prefix cache; a bounded imbalance, because a sticky map that never moves piles the long tail onto a few
servers (a server far more loaded than the least-loaded one sheds the session, which pays one cache miss).
Deterministic mode places sessions by rendezvous hashing of the session id for reproducible runs (adding a
server moves only the sessions that hash to it).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping

from .config import RouterConfig


class Decision(enum.Enum):
    NEW = "new"
    STICKY = "sticky"
    MOVED = "moved"


def _rendezvous(session_id: str, servers: Mapping[str, float]) -> str:
    def score(address: str) -> bytes:
        return hashlib.blake2b(f"{session_id}|{address}".encode(), digest_size=8).digest()

    return max(servers, key=score)


def choose_server(
    session_id: str, current: str | None, loads: Mapping[str, float], config: RouterConfig
) -> tuple[str, Decision]:
    """Pick among the healthy servers in ``loads`` (address -> load); ``current`` is the session's server, if any."""
    if not loads:
        raise ValueError("no healthy server to choose from")
    if config.deterministic:
        chosen = _rendezvous(session_id, loads)
    else:
        lowest = min(loads.values())
        # among equally loaded servers, hash the session: new sessions spread even when nothing is in flight
        least = _rendezvous(session_id, {a: load for a, load in loads.items() if load == lowest})
        if current in loads:
            gap = loads[current] - loads[least]
            overloaded = gap > config.imbalance_min_gap and loads[current] > config.imbalance_ratio * loads[least]
            chosen = least if overloaded else current
        else:
            chosen = least
    if current is None:
        return chosen, Decision.NEW
    return chosen, Decision.STICKY if chosen == current else Decision.MOVED
