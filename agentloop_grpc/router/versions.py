"""Weight-version safety: the Router routes only to servers that hold the fleet's weights.

A server that joins, restarts or wakes after a weight update holds the weights it started with; routing to it
would mix an old policy's tokens into the batch. The fleet's version is the highest the Fleet knows of: what its
own pushes answered, what servers report in GetServerInfo (fetched on every connect and while a server is held
out), what finished generations carry, and what the caller says another Fleet pushed. A server below it takes no
new request until it reports that version (the next push, or an update from elsewhere); requests it already has
are left to finish.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .metrics import RouterMetrics

log = logging.getLogger(__name__)


class ExpectedVersion:
    """The fleet's weight version: the highest any Fleet sharing it has learnt. Versions only grow."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def raise_to(self, version: int) -> bool:
        """The fleet has reached ``version``; whether that is news (a lower one changes nothing)."""
        if version <= self.value:
            return False
        self.value = version
        return True


class WeightVersions:
    """One Fleet's view: the versions its servers reported and those held out below the (shared) expected one."""

    def __init__(self, metrics: RouterMetrics, expected: ExpectedVersion | None = None) -> None:
        self._expected = expected or ExpectedVersion()
        self._behind: frozenset[str] = frozenset()
        self._held_at = 0  # the expected version ``_behind`` was computed for
        self._versions: dict[str, int] = {}
        self._metrics = metrics

    @property
    def expected(self) -> int:
        return self._expected.value

    @property
    def behind(self) -> frozenset[str]:
        """The servers held out; computed again when another Fleet sharing the expected version raised it."""
        if self._held_at != self._expected.value:
            self._hold_out()
        return self._behind

    def of(self, address: str) -> int | None:
        """The version ``address`` last reported, if any."""
        return self._versions.get(address)

    def report(self, address: str, version: int) -> None:
        """``address`` serves weight ``version`` now."""
        self.report_all({address: version})

    def report_all(self, versions: Mapping[str, int]) -> None:
        """Several servers' versions, answered together (one fan-out): recorded before anyone is held out, so
        the servers a push brought to a new version are never held out for each other."""
        changed = {a: v for a, v in versions.items() if self._versions.get(a) != v}
        if not changed:
            return
        for address, version in changed.items():
            self._versions[address] = version
            self._metrics.server_weight_version.labels(address).set(version)
        self._raise_expected(max(changed.values()))
        self._hold_out()

    def advance(self, address: str, version: int) -> None:
        """``address`` produced tokens with weight ``version``: news only when higher than it last reported (a
        message sent before an update may arrive after it; a restart is seen by GetServerInfo on reconnect)."""
        if version > self._versions.get(address, -1):
            self.report(address, version)

    def forget(self, address: str) -> None:
        """``address`` left the fleet."""
        self._versions.pop(address, None)
        self._metrics.server_behind.labels(address).set(0)
        self._hold_out()

    def _raise_expected(self, version: int) -> None:
        if self._expected.raise_to(version):
            log.info("fleet weight version %d", version)

    def _hold_out(self) -> None:
        expected = self._held_at = self._expected.value
        self._metrics.expected_weight_version.set(expected)
        behind = frozenset(a for a, version in self._versions.items() if version < expected)
        for address in sorted(behind - self._behind):
            log.warning(
                "server %s serves weight version %d, the fleet %d: held out of routing until it matches",
                address, self._versions[address], expected,
            )
            self._metrics.server_behind.labels(address).set(1)
        for address in sorted(self._behind - behind):
            if address in self._versions:
                log.info("server %s serves the fleet's weight version %d: routed to again", address, expected)
            self._metrics.server_behind.labels(address).set(0)
        self._behind = behind
