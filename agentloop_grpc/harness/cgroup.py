"""Limits on a whole process tree (a workspace's CLI and everything it starts), from the kernel's cgroups: memory
(``memory.limit_in_bytes``) and processes (``pids.max``), counted over the tree, whatever uid its processes run as.
rlimits cannot do this: they bound one process (memory: its address space, which Node and V8 reserve by the tens of
GiB without using it) or one uid (processes).

Version 1 hierarchies (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup/pids``) and the unified version 2 one are both
used where writable; where neither is, ``available()`` says why and a workspace runs with its rlimits alone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: Under each hierarchy, the folder our groups go in.
PARENT = "agentloop"


@dataclass(frozen=True, slots=True)
class Group:
    """One cgroup per workspace run: the folders holding it (one per v1 controller, or the one v2 folder)."""

    folders: tuple[Path, ...]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(folder / "cgroup.procs" for folder in self.folders)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in procs.read_text().split())
        return found

    def memory_peak(self) -> int:
        """Bytes of memory the group used at most (0 when unknown)."""
        for folder in self.folders:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                with contextlib.suppress(OSError, ValueError):
                    return int((folder / name).read_text())
        return 0

    def out_of_memory(self) -> bool:
        """Whether the kernel hit the group's memory limit (and killed in it)."""
        for folder in self.folders:
            for name in ("memory.failcnt", "memory.memsw.failcnt"):
                with contextlib.suppress(OSError, ValueError):
                    if int((folder / name).read_text()) > 0:
                        return True
            for name in ("memory.events", "memory.oom_control"):  # v2's, v1's: "oom_kill <count>" lines
                with contextlib.suppress(OSError, ValueError):
                    counts = dict(line.split()[:2] for line in (folder / name).read_text().splitlines())
                    if int(counts.get("oom_kill", 0)) > 0:
                        return True
        return False

    def kill(self) -> None:
        """SIGKILL every process of the group (again until none is left, as a dying fork bomb still forks), then
        remove its folders."""
        deadline = time.monotonic() + 5.0
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for folder in self.folders:
            for _ in range(100):  # rmdir fails while the last killed processes are still being reaped
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _v1(controller: str) -> Path | None:
    folder = ROOT / controller
    return folder if (folder / "cgroup.procs").exists() and os.access(folder, os.W_OK) else None


def _v2() -> Path | None:
    controllers = ROOT / "cgroup.controllers"
    if not controllers.exists() or not os.access(ROOT, os.W_OK):
        return None
    present = set(controllers.read_text().split())
    return ROOT if {"memory", "pids"} <= present else None


def available() -> str | None:
    """None when workspaces can be bounded by cgroups here; otherwise why not."""
    if _v2() is None and (_v1("memory") is None or _v1("pids") is None):
        return f"no writable memory and pids cgroups under {ROOT}: memory and processes bounded per process only"
    return None


def create(name: str, memory_bytes: int, max_processes: int) -> Group | None:
    """A new group bounded to ``memory_bytes`` and ``max_processes`` (None where cgroups are not available)."""
    if (v2 := _v2()) is not None:
        parent = v2 / PARENT
        parent.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # enable the controllers for our groups (once)
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        folder = parent / name
        folder.mkdir()
        (folder / "memory.max").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):
            (folder / "memory.swap.max").write_text("0")
        (folder / "pids.max").write_text(str(max_processes))
        return Group((folder,))
    memory, pids = _v1("memory"), _v1("pids")
    if memory is None or pids is None:
        return None
    folders = []
    for base in (memory, pids):
        (base / PARENT).mkdir(exist_ok=True)
        folder = base / PARENT / name
        folder.mkdir()
        folders.append(folder)
    (folders[0] / "memory.limit_in_bytes").write_text(str(memory_bytes))
    with contextlib.suppress(OSError):  # swap accounting is off on some kernels: memory alone then
        (folders[0] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
    (folders[1] / "pids.max").write_text(str(max_processes))
    return Group(tuple(folders))
