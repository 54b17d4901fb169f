"""TurnLease: what one model-turn request holds while it is in flight, and its release, whatever ends it.

A request counts against its session's ``max_concurrent_per_session`` and holds the chain it appends to (``busy``:
a request beside it forks). It lets both go once it is answered (before the reply is handed on, so a client that
reads it and finishes the session at once finds nothing in flight), or when it fails or its client goes away. A new
chain is listed in its session at once (a request beside it sees it and forks); if its first turn never completes
(refused, failed before the engines answered, or its client left) it is taken out again: it records nothing.
"""

from __future__ import annotations

from types import TracebackType

from .chain import Chain
from .sessions import Session


class TurnLease:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.chain: Chain | None = None
        self.new_chain = False
        self.committed = False
        self._released = True

    def __enter__(self) -> TurnLease:
        self.session.in_flight += 1
        self._released = False
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()

    def hold(self, chain: Chain, new_chain: bool) -> None:
        """The chain this request appends to (a new one is listed in the session now)."""
        self.chain, self.new_chain = chain, new_chain
        chain.busy = True
        if new_chain:
            self.session.chains.append(chain)

    def commit(self) -> None:
        """The turn is recorded in the chain: a new chain stays."""
        self.committed = True

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.session.in_flight -= 1
        chain = self.chain
        if chain is None:
            return
        chain.busy = False
        if self.new_chain and not self.committed and chain.ended is None and chain in self.session.chains:
            self.session.chains.remove(chain)
