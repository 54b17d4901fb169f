"""The reward of a coding trajectory: the task's hidden tests run in a fresh sandbox on the workspace the agent left.

The final workspace is copied into a new Workspace (what the agent left running is gone with its own), the tests
are bound read-only at /tests and ``bash /tests/test.sh`` runs in /app, within ``timeout_s``. The score: the pass
rate of /logs/verifier/junit.xml when there is one (``all_pass``: 1.0 only when every test passed), else
reward.txt or reward.json, else the exit code. A test run past its time scores 0.0 and says so; a sandbox that cannot
be made is an infrastructure failure (WorkspaceError)."""

from __future__ import annotations

import contextlib
import json
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .task import CodingTask
from .workspace import Workspace, WorkspaceLimits

RewardMode = Literal["pass_rate", "all_pass"]


@dataclass(frozen=True, slots=True)
class Verdict:
    reward: float
    passed: int
    failed: int
    #: How the reward was read: junit, reward_file, exit_code, or timeout.
    source: str
    output: str


async def verify(task: CodingTask, final: Path, root: Path, mode: RewardMode = "pass_rate",
                 limits: WorkspaceLimits | None = None) -> Verdict:
    """The task's tests on ``final`` (the agent's /app), in a fresh workspace under ``root``."""
    limits = limits or WorkspaceLimits(wall_timeout_s=task.verifier_timeout_s or 120.0)
    async with await Workspace.create(root, final, limits) as workspace:
        result = await workspace.run(["bash", "/tests/test.sh"], extra={"/tests": task.tests})
        logs = workspace.logs / "verifier"
        if result.cause == "workspace_timeout":
            return Verdict(0.0, 0, 0, "timeout", result.output)
        passed, failed = _junit(logs / "junit.xml")
        if passed + failed:
            rate = passed / (passed + failed)
            return Verdict(rate if mode == "pass_rate" else float(failed == 0), passed, failed, "junit",
                           result.output)
        written = _reward_file(logs)
        if written is not None:
            return Verdict(written if mode == "pass_rate" else float(written >= 1.0), 0, 0, "reward_file",
                           result.output)
        return Verdict(float(result.ok), 0, 0, "exit_code", result.output)


def _junit(path: Path) -> tuple[int, int]:
    """(passed, failed or errored) of a JUnit report; (0, 0) when there is none or it cannot be read."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return 0, 0
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return max(total - failed - skipped, 0), failed


def _reward_file(logs: Path) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        return float((logs / "reward.txt").read_text().strip())
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return float(json.loads((logs / "reward.json").read_text())["reward"])
    return None
