"""SessionBlocks: which prefix-cache blocks each session's last request left, so EndSessions can demote them.

A Router tells the engine when a trajectory ends (EndSessions); the blocks its requests left are then the least
likely to be asked for again, so they may leave the cache before any other. The table remembers, per session, the
keys of the cached blocks its latest request left (a multi-turn session's next request extends the same chain,
so the latest one holds everything of it that is reusable), and per block which tracked sessions hold it, so that
ending one sample of a GRPO group never demotes the prompt its siblings still share.

Memory is bounded by the cache, not by the sessions ever run: an entry leaves when EndSessions names it, when the
cache evicts its last block (``evicted``), or when the entries together hold more than ``max_held`` block keys
(the least recently active session is forgotten then: its blocks just age as every block does, and ending it
later demotes nothing). Used by the fake and the embedded engines, whose caches are ordered dicts of block keys,
least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any


class SessionBlocks:
    """Block keys held per session and sessions per block key (see the module docstring)."""

    __slots__ = ("_holders", "_sessions", "held", "max_held")

    def __init__(self, max_held: int) -> None:
        self.max_held = max_held
        #: session id -> the keys of the cached blocks its latest request left, a chain's head first
        self._sessions: OrderedDict[str, dict[int, None]] = OrderedDict()
        #: block key -> the tracked sessions that hold it
        self._holders: dict[int, set[str]] = {}
        #: block keys held over all entries (the memory bound)
        self.held = 0

    def __len__(self) -> int:
        """Sessions tracked."""
        return len(self._sessions)

    def note(self, session_id: str, keys: Sequence[int]) -> None:
        """``session_id``'s latest request left the cached blocks ``keys`` (head first); they replace what it held.
        A request without a session is not tracked."""
        if not session_id:
            return
        held = self._sessions.get(session_id)
        if held is not None and len(held) <= len(keys) and list(held) == keys[: len(held)]:
            self._sessions.move_to_end(session_id)  # the chain grew (the request's output, the next turn): add the rest
            keys = keys[len(held) :]
        else:
            self._drop(session_id)
            held = self._sessions[session_id] = {}
        for key in keys:
            if key not in held:
                held[key] = None
                self._holders.setdefault(key, set()).add(session_id)
                self.held += 1
        if not held:
            del self._sessions[session_id]
        while self.held > self.max_held:
            self._drop(next(iter(self._sessions)))

    def evicted(self, key: int) -> None:
        """The cache evicted block ``key``: no session holds it any more (one left holding none is forgotten)."""
        for session_id in self._holders.pop(key, ()):
            held = self._sessions[session_id]
            del held[key]
            self.held -= 1
            if not held:
                del self._sessions[session_id]

    def end(self, session_ids: Iterable[str]) -> list[int]:
        """Forget ``session_ids``; return the keys of their blocks that no other tracked session holds, each
        session's chain head first."""
        released = []
        for session_id in session_ids:
            released += [key for key in self._drop(session_id) if key not in self._holders]
        return released

    def clear(self) -> None:
        self._sessions.clear()
        self._holders.clear()
        self.held = 0

    def _drop(self, session_id: str) -> dict[int, None]:
        held = self._sessions.pop(session_id, None)
        if held is None:
            return {}
        self.held -= len(held)
        for key in held:
            holders = self._holders[key]
            holders.discard(session_id)
            if not holders:
                del self._holders[key]
        return held


def demote(cache: OrderedDict[int, Any], keys: Sequence[int]) -> int:
    """Move the cached ones of ``keys`` (chains, head first) to the evict-first end of ``cache``, so that of each
    chain its tail leaves before its head (what stays is a usable prefix); return how many moved."""
    moved = 0
    for key in keys:
        if key in cache:
            cache.move_to_end(key, last=False)
            moved += 1
    return moved
