"""Following a launcher's discovery file: the servers it adds join a Fleet, the ones it drops leave it.

``agentloop engine launch --ray`` rewrites its discovery file when a server is lost (left out) and when one is
restarted (its new address). ``follow_discovery_file`` polls the file and brings a running Fleet (a Router's
``router.fleet``) up to date; a Fleet or Router built with ``from_discovery_file`` runs it while entered:
  - an address new in the file is added (it takes traffic once SERVING and at the fleet's weight version: a
    restarted server serving older weights is held out until it has the fleet's, see versions.py);
  - an address the file no longer lists is removed once it is not healthy (a lost server; one still serving, e.g.
    a launcher restarted cleanly, keeps its in-flight calls until it stops answering);
  - addresses the Fleet has from elsewhere (not from this file) are left alone.
An unreadable or half-written file is skipped until the next poll (the launcher writes a temporary file and renames
it, so a reader never sees half of one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from .discovery import discovery_addresses


class FollowedFleet(Protocol):
    """What the follower uses of the Fleet that runs it (a protocol: fleet.py imports this module)."""

    @property
    def servers(self) -> Mapping[str, Any]: ...

    async def add_server(self, address: str) -> None: ...

    async def remove_server(self, address: str) -> None: ...

log = logging.getLogger(__name__)


async def follow_discovery_file(fleet: FollowedFleet, path: str | Path, interval_s: float = 1.0) -> None:
    """Keep ``fleet`` up to date with the discovery file at ``path`` until cancelled (see the module docstring)."""
    path = Path(path)
    listed: set[str] = set()
    gone: set[str] = set()  # dropped from the file, still in the fleet while healthy
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        listed = set(discovery_addresses(path)) & set(fleet.servers)
    seen = None
    while True:
        try:
            stat = path.stat()
            if (stat.st_mtime_ns, stat.st_size, stat.st_ino) != seen:
                addresses = set(discovery_addresses(path))
                seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                for address in sorted(addresses - listed):
                    if address not in fleet.servers:
                        log.info("discovery file %s: server %s added", path, address)
                        await fleet.add_server(address)
                gone = (gone | (listed - addresses)) - addresses
                listed = addresses
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.debug("discovery file %s not read (%s); next poll in %.1f s", path, error, interval_s)
        for address in sorted(gone):
            endpoint = fleet.servers.get(address)
            if endpoint is None or not endpoint.healthy:
                gone.discard(address)
                if endpoint is not None:
                    log.info("discovery file %s: server %s gone, removed", path, address)
                    await fleet.remove_server(address)
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def following_discovery_file(fleet: FollowedFleet, path: str | Path,
                                   interval_s: float = 1.0) -> AsyncIterator[None]:
    """``async with``: ``follow_discovery_file`` in a task for the block's duration."""
    task = asyncio.create_task(follow_discovery_file(fleet, path, interval_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
