"""VerifiersEnvironment: which verifiers environment (``verifiers==0.4.*``, the ``verifiers`` extra) gives a run its
rows and plays them, as ``dataset: {verifiers: ...}`` of a rollout or training config (docs/environments.md).

Only what can be told without importing verifiers is checked here (the config is read by every command); what needs
the environment itself (its seats, its tasks) is checked by ``environment.load_environment`` before any server
starts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class VerifiersEnvironment(BaseModel):
    """A verifiers environment: its taskset's tasks are the rows, its harness plays each through a session of the
    run's gateway, its task's rewards and judges score it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field(
        min_length=1, description="The environment's taskset id, as `vf eval` takes it: an installed package (or a "
        "top-level module on PYTHONPATH) exporting its Taskset subclass in __all__; an Environments Hub id "
        "owner/name@version names the package name.")
    args: dict[str, Any] = Field(
        {}, description="The rest of verifiers' [env] block, as in its TOML: taskset: {knobs of the "
        "taskset}, agent: {harness: {id: null, ...}, runtime: {type: subprocess}, max_turns: ..., timeout: ...}. The "
        "seat's runtime defaults to subprocess (verifiers' own default, prime, is a remote sandbox).")
    harness_wheels: str | None = Field(
        None, description="A directory of wheels that verifiers' harness programs (its uv scripts) install from, "
        "offline, in the subprocess runtime; None: <venv>/verifiers-wheels when it exists (`make setup` makes it), "
        "else uv reaches PyPI as verifiers does by itself.")

    @field_validator("args")
    @classmethod
    def _not_ours(cls, args: dict[str, Any]) -> dict[str, Any]:
        taskset = args.get("taskset") or {}
        if not isinstance(taskset, dict):
            raise ValueError("args.taskset must be a mapping of the taskset's knobs")
        if "id" in taskset:
            raise ValueError("args.taskset.id: the taskset is `env`")
        if "harness" in args:
            raise ValueError("args.harness: a harness belongs to a seat: args.agent.harness")
        retries = args.get("retries") or {}
        if isinstance(retries, dict) and retries.get("max_retries"):
            raise ValueError("args.retries: an episode retried in the same session would leave the failed attempt's "
                             "turns among its trajectories; retries are refused (failures are kept, never trained on)")
        return args
