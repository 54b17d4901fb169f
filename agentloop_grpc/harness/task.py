"""CodingTask: a repository, an instruction and hidden tests, read from a folder in Harbor's task layout.

    my-task/
      instruction.md      what the agent is asked (its whole prompt)
      task.toml           optional: [agent] timeout_sec, [verifier] timeout_sec (Harbor's keys)
      environment/        the repository the agent works in, copied into its workspace (/app), less a Dockerfile
                          or docker-compose.yaml (no container is built: a task that needs an image does not fit)
      tests/              hidden: bound read-only at /tests only when the tests run, after the agent is done;
                          tests/test.sh is run with bash in /app
      solution/           optional: solution/solve.sh, a known-good fix (run the same way, for checking a task)

The tests' verdict, as Harbor reads it: /logs/verifier/reward.txt (a number) or reward.json (``{"reward": x}``),
else the exit code of test.sh (0: 1.0, else 0.0); a JUnit report at /logs/verifier/junit.xml gives the pass rate
and counts (verifier.py)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

#: Files of environment/ that describe a container, not the repository.
CONTAINER_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore")


class TaskError(ValueError):
    """A folder that is not a task (the message names what is missing)."""


@dataclass(frozen=True, slots=True)
class CodingTask:
    name: str
    folder: Path
    instruction: str
    #: The repository (``environment/``); None: the agent starts in an empty folder.
    repo: Path | None
    tests: Path
    solution: Path | None
    agent_timeout_s: float | None = None
    verifier_timeout_s: float | None = None

    @classmethod
    def load(cls, folder: str | Path) -> CodingTask:
        folder = Path(folder).resolve()
        instruction = folder / "instruction.md"
        tests = folder / "tests"
        if not instruction.is_file():
            raise TaskError(f"{folder}: no instruction.md (a task is instruction.md, environment/ and tests/)")
        if not (tests / "test.sh").is_file():
            raise TaskError(f"{folder}: no tests/test.sh")
        config: dict = {}
        if (folder / "task.toml").is_file():
            try:
                config = tomllib.loads((folder / "task.toml").read_text())
            except tomllib.TOMLDecodeError as error:
                raise TaskError(f"{folder}/task.toml: {error}") from None
        repo = folder / "environment"
        solution = folder / "solution"
        return cls(
            name=folder.name, folder=folder, instruction=instruction.read_text().strip(),
            repo=repo if repo.is_dir() else None, tests=tests,
            solution=solution if (solution / "solve.sh").is_file() else None,
            agent_timeout_s=_seconds(config, "agent"), verifier_timeout_s=_seconds(config, "verifier"),
        )


def _seconds(config: dict, section: str) -> float | None:
    value = config.get(section, {}).get("timeout_sec")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def find_tasks(root: str | Path) -> list[CodingTask]:
    """Every task under ``root`` (a task folder itself, or a folder of them), by name."""
    root = Path(root)
    if (root / "instruction.md").is_file():
        return [CodingTask.load(root)]
    tasks = [CodingTask.load(p) for p in sorted(root.iterdir()) if (p / "instruction.md").is_file()]
    if not tasks:
        raise TaskError(f"{root}: no task folders (each holds instruction.md and tests/test.sh)")
    return tasks
