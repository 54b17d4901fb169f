"""Test-only tool: a call waits at a gate the test opens, so a test holds the server's running slots as long as it
needs, with no sleeps."""

from __future__ import annotations

import asyncio

_gates: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    """The gate of that name (one name per test: an event belongs to the event loop that first waits on it)."""
    return _gates.setdefault(name, asyncio.Event())


async def wait_at_gate(name: str) -> str:
    """Wait until the test opens the gate.

    Args:
        name: Which gate.
    """
    await gate(name).wait()
    return f"passed {name}"
