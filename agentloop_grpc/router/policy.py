"""Where a session's next request goes: pure functions, so every placement is testable without servers.

``cache_aware`` (the default) keeps a session on its server, because the previous turn's KV sits in that server's
prefix cache, within a bounded imbalance: a sticky map that never moves piles the long tail onto a few servers, so
a server far more loaded than the least-loaded one sheds the session, which pays one cache miss. A new session goes,
among the servers that are not overloaded that way, first to a server already holding its GRPO group (the samples
of one prompt: the prompt is then prefilled once per group and server; a group too large for one server spills
onto the fewest others), then to the server holding the longest prefix of its prompt (as far as the Router's own
record of what it sent tells) while the prefix it holds beyond the least-loaded server's outweighs its extra load
(``prefix_tokens_per_load``), then to the least loaded; ties are broken by a hash of the session id, so sessions
spread even when nothing is in flight. Servers that
report KV pressure take no new session while another can.

The other placements are the anchors the field measures against (bench/routing_replay.py): ``sticky_least_loaded``
(the previous default: no group or prefix), ``least_loaded`` and ``round_robin`` (per request, no stickiness), and
``consistent_hash`` (rendezvous hashing of the session id: reproducible across runs; adding a server moves only the
sessions that hash to it).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from .config import Placement, RouterConfig


class Decision(enum.Enum):
    NEW = "new"
    STICKY = "sticky"
    MOVED = "moved"


#: Placements that keep a session on its server while it is within the imbalance bound.
STICKY = frozenset({Placement.CACHE_AWARE, Placement.STICKY_LEAST_LOADED})


@dataclass(frozen=True, slots=True)
class Hints:
    """What ``cache_aware`` weighs for a session's first request besides the loads (all keyed by address)."""

    #: Servers holding live sessions of the session's group, and how many each.
    group: Mapping[str, int] = field(default_factory=dict)
    #: Servers the Router sent a prefix of this prompt to, and how many of its blocks.
    prefix: Mapping[str, int] = field(default_factory=dict)
    #: Servers reporting KV pressure or new preemptions.
    pressured: Collection[str] = frozenset()


NO_HINTS = Hints()


def _rendezvous(session_id: str, servers: Iterable[str]) -> str:
    def score(address: str) -> bytes:
        return hashlib.blake2b(f"{session_id}|{address}".encode(), digest_size=8).digest()

    return max(servers, key=score)


def _overloaded(load: float, lowest: float, config: RouterConfig) -> bool:
    """Whether a server with ``load`` is imbalanced enough against the least-loaded one to shed a session."""
    return load - lowest > config.imbalance_min_gap and load > config.imbalance_ratio * lowest


def keeps(load: float, lowest: float, config: RouterConfig) -> bool:
    """Whether a sticky placement leaves a session on its (routable) server, which carries ``load`` while the
    least-loaded routable server carries ``lowest``: within the imbalance bound. The common case of every call, so
    it takes the lowest load as the Fleet keeps it (lowest_load.py) rather than a min() over every server."""
    return not _overloaded(load, lowest, config)


def least_loaded(session_id: str, loads: Mapping[str, float]) -> str:
    """The least-loaded server; among equally loaded ones, a hash of the session decides (one hash, not one per
    server: an idle fleet of 256 ties them all)."""
    lowest = min(loads.values())
    least = [address for address, load in loads.items() if load == lowest]
    if len(least) == 1:
        return least[0]
    least.sort()  # the same choice whatever order the servers come in
    return least[int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest()) % len(least)]


def place(session_id: str, loads: Mapping[str, float], config: RouterConfig, hints: Hints = NO_HINTS) -> str:
    """``cache_aware``'s server for a session's first request (or one that leaves its server): see the module
    docstring for the order of preferences."""
    candidates = loads
    if hints.pressured:
        candidates = {a: load for a, load in loads.items() if a not in hints.pressured} or loads
    lowest = min(candidates.values())
    # only servers within the imbalance bound may take the session for its group's or prefix's sake
    group = [a for a in hints.group if a in candidates and not _overloaded(candidates[a], lowest, config)]
    if group:
        # the group's fullest server first: the group stays on the fewest servers; then the less loaded
        return min(group, key=lambda a: (-hints.group[a], candidates[a], a))
    # a prefix is worth some queue: a server holding more of the prompt than the least-loaded one draws the session
    # while its extra load is at most one request per prefix_tokens_per_load tokens it holds beyond that one's (a
    # system prompt every server soon holds then weighs nothing, a long shared history much)
    least = least_loaded(session_id, candidates)
    base = hints.prefix.get(least, 0)
    block_tokens, per_load = config.prefix_block_tokens, config.prefix_tokens_per_load
    prefix = [a for a, n in hints.prefix.items()
              if n > base and a in candidates and not _overloaded(candidates[a], lowest, config)
              and candidates[a] - lowest <= (n - base) * block_tokens / per_load]
    if prefix:
        return min(prefix, key=lambda a: (-hints.prefix[a], candidates[a], a))
    return least


def choose_server(
    session_id: str,
    current: str | None,
    loads: Mapping[str, float],
    config: RouterConfig,
    hints: Hints = NO_HINTS,
    sequence: int = 0,
) -> tuple[str, Decision]:
    """Pick among the routable servers in ``loads`` (address -> load); ``current`` is the session's server, if any;
    ``sequence`` counts the Router's requests (round-robin's turn)."""
    if not loads:
        raise ValueError("no healthy server to choose from")
    placement = Placement(config.placement)  # a config copied with model_copy(update=...) may hold a plain string
    if placement in STICKY and current is not None and current in loads and keeps(
        loads[current], min(loads.values()), config
    ):
        return current, Decision.STICKY
    if placement is Placement.CACHE_AWARE:
        chosen = place(session_id, loads, config, hints)
    elif placement is Placement.STICKY_LEAST_LOADED or placement is Placement.LEAST_LOADED:
        chosen = least_loaded(session_id, loads)
    elif placement is Placement.CONSISTENT_HASH:
        chosen = _rendezvous(session_id, loads)
    else:
        addresses = sorted(loads)
        chosen = addresses[sequence % len(addresses)]
    return chosen, decision_for(current, chosen)


def decision_for(current: str | None, chosen: str) -> Decision:
    """What choosing ``chosen`` means for a session whose server is ``current`` (None: it has none yet)."""
    if current is None:
        return Decision.NEW
    return Decision.STICKY if chosen == current else Decision.MOVED
