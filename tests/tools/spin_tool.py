"""A test-only tool that burns CPU in one C call holding the GIL, as a pathological calculator input once did."""

import time


def spin(seconds: float) -> str:
    """Burn CPU for about ``seconds`` without letting another thread of this process run.

    Args:
        seconds: How long to burn.
    """
    chunk = 1_000_000
    started = time.perf_counter()
    sum(range(chunk))
    per_second = chunk / (time.perf_counter() - started)
    return str(sum(range(int(per_second * seconds))))
