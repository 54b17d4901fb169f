"""EnvironmentPlayer: a verifiers environment as an agent program of the session gateway (gateway/agents.py), so a
row of it is played like any agent's: a session per sample, its key, its timeout, token-exact chains.

One row, one episode (``Env.run_episode``): verifiers' interception server relays the harness program's model calls
through its eval client, whose base URL and key are the session's, so every call is a turn of the session; the
task's rewards and judges score the trace, and their sum is posted to the session's reward route (the metrics with
it). Each episode runs inside its own ``Env.serving()`` (interception, the taskset's shared tool servers): verifiers
keeps one HTTP client per endpoint until serving ends, and every session is an endpoint of its own.

What failed is told apart as verifiers tells it: an error on the trace (the harness program, a tool server, the
sandbox, the task's setup or scoring, a model call the gateway refused) or in the env's hooks, or a setup, finalize
or scoring deadline, raises ``EnvironmentFailure`` naming it, which fails the session as an infrastructure failure
(never trained on), counted under its cause (``CAUSES``). A bad answer is only a low reward, and so is an agent
deadline (verifiers scores what the agent did in time).
"""

from __future__ import annotations

import math
import os
import secrets
from typing import TYPE_CHECKING, Any

import httpx

from agentloop_grpc.gateway.agents import AgentProgramError

from .environment import task_of

if TYPE_CHECKING:
    from verifiers.v1 import Env, Episode

#: Deadlines that are the environment's, not the agent's.
_INFRASTRUCTURE_TIMEOUTS = ("setup_timeout", "finalize_timeout", "scoring_timeout")


#: The failure cause counted for each of verifiers' error types (others: ``environment``).
CAUSES = {"HarnessError": "environment_harness", "ToolsetError": "environment_tool_server",
          "SandboxError": "environment_sandbox", "TaskError": "environment_task",
          "ProviderError": "environment_model_call", "InterceptionError": "environment_model_call",
          "TunnelError": "environment_model_call"}


class EnvironmentFailure(AgentProgramError):
    """The environment, not the model, failed the episode: ``cause`` says which part, the message what and why."""


class EnvironmentPlayer:
    """Plays rows of ``env`` (rows of ``environment.environment_rows``) as gateway sessions: ``play`` is the agent
    function (``fn(base_url=..., api_key=..., row=..., session_id=...)``). ``model``: the name its calls carry."""

    def __init__(self, env: Env, model: str = "agentloop") -> None:
        self.env = env
        self.model = model

    async def play(self, base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> None:
        import verifiers.v1 as vf

        task = task_of(self.env, row)
        # verifiers reads a client's key from a variable; one per session, and its name holds API_KEY, which
        # verifiers' subprocess runtime keeps out of every program it starts
        variable = f"AGENTLOOP_SESSION_API_KEY_{secrets.token_hex(8)}"
        os.environ[variable] = api_key
        try:
            ctx = vf.ModelContext(model=self.model, client=vf.EvalClientConfig(base_url=base_url,
                                                                                api_key_var=variable))
            async with self.env.serving():
                episode = await self.env.run_episode(task, ctx)
        finally:
            os.environ.pop(variable, None)
        failed = failure(episode)
        if failed is not None:
            raise failed
        (trace,) = episode.traces
        metrics = {f"reward/{name}": r.score for name, r in trace.rewards.items() if r is not None}
        metrics.update({name: value for name, value in trace.metrics.items() if isinstance(value, int | float)})
        async with httpx.AsyncClient(timeout=30.0) as http:
            posted = await http.post(f"{base_url.removesuffix('/v1')}/reward",
                                     headers={"Authorization": f"Bearer {api_key}"},
                                     json={"reward": float(trace.reward),
                                           "metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(v)}})
            posted.raise_for_status()


def failure(episode: Episode) -> EnvironmentFailure | None:
    """Why the environment failed ``episode`` (None: it did not; a low reward is not a failure)."""
    if episode.errors:
        return _error("the environment", episode.errors[-1])
    if len(episode.traces) != 1:
        return EnvironmentFailure("environment", f"the environment ran {len(episode.traces)} agents in one episode "
                                  "(one seat is played)")
    (trace,) = episode.traces
    if trace.errors:
        return _error("the episode", trace.errors[-1])
    if trace.stop_condition in _INFRASTRUCTURE_TIMEOUTS:
        return EnvironmentFailure("environment_deadline", f"the episode's "
                                  f"{trace.stop_condition.removesuffix('_timeout')} ran past its deadline")
    return None


def _error(where: str, error: Any) -> EnvironmentFailure:
    message = " ".join(str(error.message).split())
    return EnvironmentFailure(CAUSES.get(error.type, "environment"),
                              f"{where} failed with verifiers {error.type}: {message[:800]}")
