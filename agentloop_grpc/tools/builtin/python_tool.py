"""python: a sandboxed Python session per trajectory (see ``sandbox.py`` for what isolates it).

The instance keeps its variables between calls. Exceptions in the code, time-outs and limits are tool errors the
model reads; the server is never at risk.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..result import RewardResult, ToolErrorKind, ToolResult, ToolSpec
from ..sandbox import PythonSession, SandboxLimits, probe_isolation

log = logging.getLogger(__name__)

FIRST_SANDBOX_UID = 200_000
_FAILURES = {"timeout": ToolErrorKind.TIMEOUT, "malformed": ToolErrorKind.EXCEPTION,
             "resource_limit": ToolErrorKind.RESOURCE_LIMIT}


def _uids_in_use() -> set[int]:
    in_use = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    in_use.add(int(line.split()[1]))
                    break
        except OSError:  # the process exited meanwhile
            continue
    return in_use


def _free_uids() -> Iterator[int]:
    """Unprivileged uids no live process uses (a killed session's processes may still be exiting)."""
    for uid in itertools.cycle(range(FIRST_SANDBOX_UID, FIRST_SANDBOX_UID + 50_000)):
        if uid not in _uids_in_use():
            yield uid


class PythonTool:
    """The python tool."""

    def __init__(self, sandbox_root: str | None = None, **limits: Any) -> None:
        """``limits`` are SandboxLimits fields (wall_timeout_s, cpu_seconds, memory_bytes, output_bytes, ...).
        ``sandbox_root`` holds unisolated sessions' folders (isolated ones have no folder on the host); without
        it a temporary folder does, removed by ``close``."""
        self._limits = SandboxLimits(**limits)
        self._as_root = os.geteuid() == 0
        self._uids = _free_uids()
        self.isolation_problem = probe_isolation()
        self._root: Path | None = None
        self._own_root = sandbox_root is None
        if self.isolation_problem:
            log.warning("PYTHON SANDBOX IS NOT ISOLATED: %s. Sessions keep rlimits and time-outs but share this "
                        "host's network and filesystem, with no quota on disk.", self.isolation_problem)
            self._root = Path(sandbox_root or tempfile.mkdtemp(prefix="agentloop-sandboxes-"))
            self._root.mkdir(parents=True, exist_ok=True)
            os.chmod(self._root, 0o711)  # sessions of other uids can reach their own folder below it
        isolation = (
            "Runs isolated: no network, only a private folder /work, limited CPU, memory, disk and output."
            if not self.isolation_problem
            else f"WARNING: NOT ISOLATED ({self.isolation_problem}): has network and filesystem access."
        )
        self.spec = ToolSpec(
            name="python",
            description=(
                "Run Python code in a session that keeps its variables between calls; printed output and the "
                f"value of a final expression are returned. Standard library only. {isolation} Time limit "
                f"{self._limits.wall_timeout_s:g} s per call."
            ),
            parameters={
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python source to execute."}},
                "required": ["code"],
                "additionalProperties": False,
            },
        )

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> PythonSession:
        if kwargs:
            raise ValueError(f"python takes no creation arguments, got {sorted(kwargs)}")
        uids = self._uids if self._as_root else None
        workdir = None if self._root is None else Path(tempfile.mkdtemp(prefix="session-", dir=self._root))
        return PythonSession(self._limits, uids, workdir)

    async def execute(self, state: PythonSession, arguments: dict[str, Any]) -> ToolResult:
        reply = await state.run(arguments["code"])
        if "failure" in reply:
            return ToolResult.error(_FAILURES[reply["failure"]], reply["message"])
        text = reply["output"]
        if reply["truncated"]:
            text += f"\n[output truncated: {reply['printed']} bytes printed, {self._limits.output_bytes} kept]"
        if reply["restarted"]:
            text = "[the session was restarted; earlier variables are gone]\n" + text
        metrics = {"printed_bytes": float(reply["printed"])}
        if reply["error"]:
            kind = ToolErrorKind.RESOURCE_LIMIT if "MemoryError" in reply["error"] else ToolErrorKind.EXCEPTION
            return ToolResult(content=(text + reply["error"]).strip(), error_kind=kind, metrics=metrics)
        return ToolResult(content=text.rstrip("\n"), metrics=metrics)

    async def reward(self, state: PythonSession) -> RewardResult:
        return RewardResult(0.0)

    async def release(self, state: PythonSession) -> None:
        await state.close()

    async def close(self) -> None:
        if self._root is not None and self._own_root:
            await asyncio.to_thread(shutil.rmtree, self._root, True)
