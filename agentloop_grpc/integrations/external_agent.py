"""ExternalAgent: an agent of your own playing the samples instead of our loops, as configured (the ``agent:``
section of ``agentloop rollout`` and ``agentloop train``, and TRL's and verl's ``agent=``); ``gateway_player.py``
plays it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.harness.clis import HarnessName

from .verifiers.config import VerifiersEnvironment

_STRICT = ConfigDict(frozen=True, extra="forbid")


class WorkspaceSettings(BaseModel):
    """Each coding trajectory's sandbox (harness/workspace.py): its bounds, and where it is made."""

    model_config = _STRICT

    wall_timeout_s: float = Field(600.0, gt=0, description="How long the CLI may run (a task's [agent] timeout_sec "
                                  "bounds it further); past it, it is stopped: a failure, never trained on.")
    cpu_seconds: int = Field(600, ge=1, description="CPU seconds of each of its processes.")
    memory_mib: int = Field(4096, ge=64, description="Memory of the whole process tree (cgroup).")
    max_processes: int = Field(512, ge=4, description="Processes and threads of the tree at once (cgroup).")
    disk_mib: int = Field(1024, ge=1, description="What the workspace and the CLI's home may hold.")
    output_kib: int = Field(1024, ge=1, description="What is kept of the CLI's output.")
    read_only: tuple[str, ...] = Field((), description="More host folders the sandbox may read (where a command "
                                       "harness's own program lives), at the same paths.")
    root: str = Field("/tmp/agentloop-workspaces", description="Where workspaces are made (each removed with its "
                      "trajectory).")


class ExternalAgent(BaseModel):
    """An agent of your own plays every sample instead of our loops (docs/gateway.md): each sample is a session of
    the session gateway this run serves, which the agent talks to through the OpenAI or Anthropic API; its
    trajectories are the session's chains. Exactly one of callable and command. ``loops``, ``interactions``,
    ``workers``, ``ray`` and ``max_concurrency`` of the rollout do not apply; tools are started as configured, the
    agent runs its own (``tools: {launch: null}`` starts none)."""

    model_config = _STRICT

    callable: str | None = Field(
        None, description="module:function, called per session as fn(base_url=..., api_key=..., row=<dict>, "
        "session_id=...): async, or sync (then in a thread of its own); what it returns is ignored. base_url is "
        "the session's OpenAI base URL ({url}/sessions/{id}/v1); its reward route is {url}/sessions/{id}/reward.")
    command: tuple[str, ...] | None = Field(
        None, min_length=1, description="A command line started per session with OPENAI_BASE_URL, OPENAI_API_KEY, "
        "ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, AGENTLOOP_SESSION_ID, AGENTLOOP_REWARD_URL and AGENTLOOP_ROW (the "
        "row as JSON) in its environment; its output goes to output_dir/logs/agents/<session>.log; a non-zero exit "
        "is a crash.")
    verifiers: VerifiersEnvironment | None = Field(
        None, description="A verifiers environment plays each row: set from dataset.verifiers, whose rows it plays.")
    harness: HarnessName | None = Field(
        None, description="An unmodified coding CLI plays each row's task (docs/coding-agents.md): codex, "
        "claude-code, mini-swe-agent, or command (agent.command, run in the workspace); the reward is the task's "
        "hidden tests.")
    workspace: WorkspaceSettings = Field(default_factory=WorkspaceSettings, description="harness: each "
                                         "trajectory's sandbox.")
    tests_reward: Literal["pass_rate", "all_pass"] = Field(
        "pass_rate", description="harness: the reward from the hidden tests, their pass rate or 1.0 only when all "
        "pass (a test run past its time: 0.0).")
    trajectory_selection: Literal["all", "longest", "last"] = Field(
        "all", description="Which chains of a session are kept (an agent that compacts or runs sub-agents forks "
        "chains): all, the longest, or the last.")
    max_concurrency: int = Field(32, ge=1, le=100_000, description="Sessions (agents) running at once.")
    timeout_s: float = Field(
        600.0, gt=0, description="How long one agent may run; past it, it is stopped (a command's process group "
        "killed) and its session is an infrastructure failure, never trained on.")
    reward: Literal["session", "function"] = Field(
        "session", description="session: what the agent posted to its session's reward route (0.0 when nothing); "
        "function: the rollout's reward function, with the row's ground truth (what an agent posts is ignored).")
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="The session gateway: forced sampling, limits, tool-call format.")

    @model_validator(mode="after")
    def _one_program(self) -> ExternalAgent:
        if self.harness is not None:
            if self.callable is not None or self.verifiers is not None:
                raise ValueError("agent.harness: give no callable (the harness plays the rows)")
            if (self.harness == "command") != (self.command is not None):
                raise ValueError("agent.command: the command harness runs agent.command, and only it has one")
        elif sum(program is not None for program in (self.callable, self.command, self.verifiers)) != 1:
            raise ValueError("agent: give exactly one of callable or command (or a dataset: {verifiers: ...}, which "
                             "its environment plays)")
        if self.verifiers is not None and self.reward == "function":
            raise ValueError("agent.reward: a verifiers environment's rewards score its rows; use reward: session")
        if self.callable is not None and ":" not in self.callable:
            raise ValueError(f"agent.callable: {self.callable!r} is not of the form module:function")
        if self.timeout_s > self.gateway.limits.session_ttl_s:
            raise ValueError(f"agent.timeout_s ({self.timeout_s:g}) is longer than agent.gateway.limits.session_ttl_s "
                             f"({self.gateway.limits.session_ttl_s:g}): a quiet agent's session would expire first")
        return self
