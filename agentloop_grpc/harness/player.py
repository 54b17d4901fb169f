"""HarnessPlayer: one coding task played by an unmodified CLI, as a gateway session's agent program.

Per trajectory: (1) a workspace with a fresh copy of the task's repository (workspace.py; one that cannot be made
fails the session as infrastructure, by cause); (2) the CLI in it (clis.py), its model the session, within the
workspace's bounds (one that hangs, crashes on a signal or crosses a bound is stopped and its session failed by
cause: ``harness_timeout``, ``harness_crashed``, ``workspace_memory``, ``workspace_disk``); (3) the task's hidden
tests in a fresh sandbox on what it left (verifier.py): the reward, posted to the session; (4) the workspace
removed. A CLI that exits with a non-zero code is scored like one that exits 0: CLIs exit so when the model's turn
was unusable (Codex on a reply cut at its token limit), an outcome of the model's to train on, not the
infrastructure's (a CLI that never asked the model leaves no chain: a failure, ``agent_no_turn``). What the CLI
printed (its tail), its exit code, the final diff and the tests' counts go into the trajectories' metadata.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from agentloop_grpc.gateway.agents import AgentProgramError

from .clis import HarnessName, find_program, launch
from .task import CONTAINER_FILES, CodingTask
from .verifier import RewardMode, verify
from .workspace import Workspace, WorkspaceError, WorkspaceLimits

#: What of the CLI's output and of the diff the metadata keeps (their ends, where the outcome is).
METADATA_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class HarnessSettings:
    harness: HarnessName
    #: The model name the CLI asks for (the gateway serves one model whatever it is).
    model: str = "agentloop"
    command: tuple[str, ...] = ()
    limits: WorkspaceLimits = field(default_factory=WorkspaceLimits)
    reward: RewardMode = "pass_rate"
    #: Where workspaces are made (removed with their trajectory).
    root: Path = Path("/tmp/agentloop-workspaces")
    #: More host folders the sandbox may read (a command harness's own program).
    read_only: tuple[Path, ...] = ()


class HarnessPlayer:
    """``play`` is an AgentProgram function (gateway/agents.py): called per session with its URL, key and row,
    whose ``task`` names the task's folder."""

    def __init__(self, settings: HarnessSettings) -> None:
        self.settings = settings
        if settings.harness != "command":
            find_program(settings.harness)  # HarnessError now, not per session

    async def play(self, base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> dict[str, str]:
        settings = self.settings
        try:
            task = CodingTask.load(row["task"])
        except (KeyError, TypeError, ValueError, OSError) as error:
            raise AgentProgramError("harness_task", f"the row names no task folder that loads: {error}") from None
        url = urlsplit(base_url)
        gateway = (url.hostname or "127.0.0.1", url.port or 80)
        spec = launch(settings.harness, task.instruction, session_id, api_key, settings.model, settings.command)
        limits = settings.limits
        if task.agent_timeout_s is not None:
            limits = _with_wall(limits, min(limits.wall_timeout_s, task.agent_timeout_s))
        metadata = {"harness": settings.harness, "task": task.name}
        try:
            async with await Workspace.create(settings.root, task.repo, limits, CONTAINER_FILES) as workspace:
                for name, text in spec.files.items():
                    path = workspace.home / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                result = await workspace.run(spec.argv, spec.env, gateway=gateway,
                                             binds=(*spec.binds, *settings.read_only))
                metadata |= {"exit_code": str(result.exit_code), "output": result.output[-METADATA_CHARS:],
                             "seconds": f"{result.seconds:g}",
                             "diff": (await asyncio.to_thread(diff, task.repo, workspace.app))[-METADATA_CHARS:]}
                if result.cause is not None:
                    cause = "harness_timeout" if result.cause == "workspace_timeout" else result.cause
                    raise AgentProgramError(cause, f"the {settings.harness} CLI was stopped: {result.cause} "
                                            f"(bounds: {limits})", metadata)
                if result.exit_code is not None and result.exit_code > 128:  # a signal: no outcome of the model's
                    raise AgentProgramError("harness_crashed", f"the {settings.harness} CLI was killed by signal "
                                            f"{result.exit_code - 128}: {result.output[-400:]}", metadata)
                verdict = await verify(task, workspace.app, settings.root, settings.reward)
        except WorkspaceError as error:
            raise AgentProgramError(error.cause, str(error), metadata) from None
        metadata |= {"tests_passed": str(verdict.passed), "tests_failed": str(verdict.failed),
                     "verdict": verdict.source, "tests_output": verdict.output[-METADATA_CHARS:]}
        async with httpx.AsyncClient(timeout=30) as http:  # the reward route of the session's key
            reply = await http.post(f"{base_url.removesuffix('/v1')}/reward", headers={
                "authorization": f"Bearer {api_key}"}, json={"reward": verdict.reward, "metrics": {
                    "tests_passed": float(verdict.passed), "tests_failed": float(verdict.failed)}})
            reply.raise_for_status()
        return metadata


def _with_wall(limits: WorkspaceLimits, seconds: float) -> WorkspaceLimits:
    return dataclasses.replace(limits, wall_timeout_s=seconds)


#: What a diff leaves out: the container's files (never copied) and caches tools leave behind.
_NOT_CHANGES = frozenset({*CONTAINER_FILES, "__pycache__", ".pytest_cache"})


def diff(original: Path | None, final: Path) -> str:
    """The agent's changes to the repository as a unified diff (paths relative to it; binary files named)."""
    before, after = _files(original), _files(final)
    out: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = _text(before.get(name)), _text(after.get(name))
        if old == new:
            continue
        if (old is None and name in before) or (new is None and name in after):
            out.append(f"Binary file {name} changed\n")
            continue
        out += difflib.unified_diff((old or "").splitlines(True), (new or "").splitlines(True),
                                    f"a/{name}" if name in before else "/dev/null",
                                    f"b/{name}" if name in after else "/dev/null")
    return "".join(out)


def _files(root: Path | None) -> dict[str, Path]:
    if root is None:
        return {}
    found = {}
    for base, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f not in _NOT_CHANGES]
        for name in files:
            if name not in _NOT_CHANGES:
                path = Path(base, name)
                found[str(path.relative_to(root))] = path
    return found


def _text(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except (UnicodeDecodeError, OSError):
        return None
