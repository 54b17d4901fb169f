"""How each coding CLI is started, unmodified, non-interactive and auto-approving, inside a workspace with its model
at the trajectory's gateway session (the sandbox is the CLI's only boundary, so its own is turned off).

- ``codex``: ``codex exec`` with a private CODEX_HOME whose config.toml names a model provider at the session's
  ``/v1`` (streamed Responses), its key in AGENTLOOP_API_KEY;
- ``claude-code``: ``claude -p`` with ANTHROPIC_BASE_URL at the session (it adds ``/v1/messages``), permissions
  skipped (IS_SANDBOX=1 allows that as root), telemetry and updates off;
- ``mini-swe-agent``: ``mini`` from its own venv, the model ``openai/<model>`` through litellm at the session's
  ``/v1``, yolo mode, no cost limit but a step limit, exiting when done;
- ``command``: a command line of yours, given the same environment as a gateway command agent (OPENAI_BASE_URL,
  ANTHROPIC_BASE_URL, their keys) and the instruction in AGENTLOOP_INSTRUCTION.

The CLIs come from ``make setup`` at the versions the repository pins (harnesses/package.json for the npm ones,
``.venv/harnesses/mini-swe-agent`` for mini-swe-agent), else from PATH."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .workspace import GATEWAY_PORT, HOME

HarnessName = Literal["codex", "claude-code", "mini-swe-agent", "command"]
#: The repository's harness installs (``make setup``), beside the package.
_REPO = Path(__file__).resolve().parents[2]
NPM_PACKAGES = _REPO / "harnesses" / "node_modules"
MINI_SWE_AGENT_VENV = _REPO / ".venv" / "harnesses" / "mini-swe-agent"
_PROGRAMS = {"codex": "codex", "claude-code": "claude", "mini-swe-agent": "mini"}
#: mini-swe-agent's own bound on model calls (its default is none, and with no cost limit nothing else ends an agent
#: whose model never submits; the workspace's wall time would, as a failure).
MINI_SWE_AGENT_STEP_LIMIT = 64


class HarnessError(Exception):
    """A harness that cannot run here (its CLI is not installed): the message says how to install it."""


@dataclass(frozen=True, slots=True)
class Launch:
    """One CLI run: its command line and environment in the sandbox, the host folders it reads, and the files it
    finds in its home (relative path -> text)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    binds: tuple[Path, ...] = ()
    files: dict[str, str] = field(default_factory=dict)


def session_url(session_id: str) -> str:
    """The trajectory's session as the sandbox reaches it (its own loopback, bridged to the gateway)."""
    return f"http://127.0.0.1:{GATEWAY_PORT}/sessions/{session_id}"


def find_program(harness: HarnessName) -> tuple[Path, tuple[Path, ...]]:
    """The CLI's program and the folders it needs bound; HarnessError when it is not installed."""
    name = _PROGRAMS[harness]
    if harness == "mini-swe-agent":
        installed = MINI_SWE_AGENT_VENV / "bin" / name
        if installed.exists():
            return installed, (MINI_SWE_AGENT_VENV,)
    else:
        installed = NPM_PACKAGES / ".bin" / name
        if installed.exists():
            return installed, (NPM_PACKAGES,)
    found = shutil.which(name)
    if found is None:
        raise HarnessError(f"harness {harness}: {name} is not installed (`make setup` installs the pinned version; "
                           f"or put {name} on PATH)")
    program = Path(found).resolve()
    return program, (program.parent.parent,)


def launch(harness: HarnessName, instruction: str, session_id: str, key: str, model: str,
           command: tuple[str, ...] = ()) -> Launch:
    """How ``harness`` starts for one trajectory (``command``: the command line of the ``command`` harness)."""
    base = session_url(session_id)
    gateway_env = {
        "OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": key, "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": key, "AGENTLOOP_SESSION_ID": session_id, "AGENTLOOP_INSTRUCTION": instruction,
    }
    if harness == "command":
        if not command:
            raise HarnessError("harness command: give agent.command")
        return Launch(tuple(command), gateway_env)
    program, binds = find_program(harness)
    if harness == "codex":
        config = (f'model = "{model}"\nmodel_provider = "agentloop"\n\n[model_providers.agentloop]\n'
                  f'name = "agentloop"\nbase_url = "{base}/v1"\nwire_api = "responses"\n'
                  'env_key = "AGENTLOOP_API_KEY"\n')
        argv: tuple[str, ...] = (str(program), "exec", "--skip-git-repo-check",
                                 "--dangerously-bypass-approvals-and-sandbox", "--color", "never", instruction)
        return Launch(argv, {"CODEX_HOME": f"{HOME}/.codex", "AGENTLOOP_API_KEY": key}, binds,
                      {".codex/config.toml": config})
    if harness == "claude-code":
        env = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key, "IS_SANDBOX": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_ERROR_REPORTING": "1"}
        return Launch((str(program), "-p", instruction, "--dangerously-skip-permissions"), env, binds)
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{base}/v1", "MSWEA_CONFIGURED": "true",
           "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = (str(program), "-t", instruction, "--yolo", "--exit-immediately", "-l", "0", "-m", f"openai/{model}",
            "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={base}/v1",
            "-c", f"agent.step_limit={MINI_SWE_AGENT_STEP_LIMIT}", "-o", f"{HOME}/trajectory.json")
    return Launch(argv, env, binds)
