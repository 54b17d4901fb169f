"""A closed-loop load driver for the latency benchmarks: a fixed number of callers, each sending its next call as
soon as its last one answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(call: Callable[[int], Awaitable[object]], calls: int, in_flight: int) -> dict[str, float]:
    """``calls`` invocations of ``call(i)``, ``in_flight`` at a time: calls/s and p50/p99 latency (ms)."""
    latencies: list[float] = []
    counter = iter(range(calls))

    async def caller() -> None:
        for i in counter:
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    return {"calls_per_s": calls / elapsed, "p50_ms": 1e3 * percentile(latencies, 0.5),
            "p99_ms": 1e3 * percentile(latencies, 0.99)}
