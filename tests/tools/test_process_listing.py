"""The tests' listing of this process's children survives what other tests leave behind."""

from __future__ import annotations

import subprocess
import sys

import psutil

from .conftest import children, until


async def test_a_zombie_child_left_by_another_test_is_passed_over() -> None:
    """An earlier test's unreaped child (vLLM's engine core was one) made the listing raise psutil.ZombieProcess
    in tests that look for tool workers."""
    marker = "agentloop-zombie-marker"
    child = subprocess.Popen([sys.executable, "-c", "pass", marker])
    try:
        await until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)  # exited, not reaped
        assert children(marker) == set()
        assert child.pid not in children("")
    finally:
        child.wait()


async def test_a_live_child_is_listed_and_one_that_exits_is_not() -> None:
    marker = "agentloop-sleeper-marker"
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", marker], stdin=subprocess.PIPE)
    try:
        assert children(marker) == {child.pid}
    finally:
        child.stdin.close()
        child.wait()
    assert children(marker) == set()
