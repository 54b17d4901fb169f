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
from collections.abc import Iterable, Mapping

from .config import RouterConfig


class Decision(enum.Enum):
    NEW = "new"
    STICKY = "sticky"
    MOVED = "moved"


def _rendezvous(session_id: str, servers: Iterable[str]) -> str:
    def score(address: str) -> bytes:
        return hashlib.blake2b(f"{session_id}|{address}".encode(), digest_size=8).digest()

    return max(servers, key=score)


def _overloaded(load: float, lowest: float, config: RouterConfig) -> bool:
    """Whether a server with ``load`` is imbalanced enough against the least-loaded one to shed a session."""
    return load - lowest > config.imbalance_min_gap and load > config.imbalance_ratio * lowest


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
        # hashing runs only when it decides something (every call pays for this function): a session that stays
        # needs no hash, and neither does a single least-loaded server
        if current is not None and current in loads and not _overloaded(loads[current], lowest, config):
            chosen = current
        else:
            # among equally loaded servers, hash the session: new sessions spread even when nothing is in flight
            least = [address for address, load in loads.items() if load == lowest]
            chosen = least[0] if len(least) == 1 else _rendezvous(session_id, least)
    if current is None:
        return chosen, Decision.NEW
    return chosen, Decision.STICKY if chosen == current else Decision.MOVED
