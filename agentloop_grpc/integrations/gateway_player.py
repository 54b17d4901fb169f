"""GatewayPlayer: an agent of your own (``ExternalAgent``) playing samples through the session gateway, the
``Player`` (agent/player.py) that ``agentloop rollout``, TRL's ``AgentLoopRollout`` and verl's manager use instead
of our loops.

Made: the agent's program is checked (the callable imports, the command's program exists, the reward function
imports, the gateway extra is installed, a harness has its sandbox, a verifiers environment loads), before any
server starts: ``AgentConfigError`` (one line) when it cannot run. ``start``: the session gateway is served in this
process over the caller's Router (the codec of the engines' model, the gateway config's tool-call format; see
gateway/in_process.py), until ``close``. ``play``: every sample as a session (its agent gets ``agent_row``), its
chains in the samples' order (``one_per_sample``: each sample's main chain alone, or the one
``trajectory_selection`` kept, and the others counted in ``forked_chains``: what a trainer taking one completion
per prompt trains on).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop_grpc.agent import AgentLoopConfig, Sample, Trajectory
from agentloop_grpc.agent.spec import ComponentSpec, load_codec
from agentloop_grpc.router import Router

from .external_agent import ExternalAgent

if TYPE_CHECKING:
    from agentloop_grpc.gateway.agents import AgentProgram, ExternalAgents


class AgentConfigError(ValueError):
    """An agent's program cannot run (the message is one line, naming the config field): found before any server
    starts."""


def check_agent(agent: ExternalAgent, reward: ComponentSpec | None) -> AgentProgram:
    """The agent's program, or AgentConfigError when it cannot run (``reward``: the run's reward function,
    imported when the agent's reward is ``function``)."""
    try:
        from agentloop_grpc.gateway.agents import AgentProgram
        from agentloop_grpc.gateway.app import create_app  # noqa: F401 - FastAPI and uvicorn: the extra
    except ImportError as error:
        raise AgentConfigError(f"agent: the session gateway needs the 'gateway' extra (pip install "
                               f"'agentloop-grpc[gateway]'): {error}") from None
    if agent.reward == "function" and reward is not None:
        _resolve("reward", reward.path)
    if agent.verifiers is not None:
        from .verifiers.environment import VerifiersError, load_environment
        from .verifiers.player import EnvironmentPlayer

        try:
            return AgentProgram(function=EnvironmentPlayer(load_environment(agent.verifiers), agent.gateway.model).play)
        except VerifiersError as error:
            raise AgentConfigError(f"dataset.verifiers: {error}") from None
    if agent.harness is not None:
        return AgentProgram(function=_harness_player(agent).play)
    if agent.callable is not None:
        function = _resolve("agent.callable", agent.callable)
        if not callable(function):
            raise AgentConfigError(f"agent.callable: {agent.callable} is a {type(function).__name__}, not a function")
        return AgentProgram(function=function)
    assert agent.command is not None  # the config has one of the two
    if shutil.which(agent.command[0]) is None:
        raise AgentConfigError(f"agent.command: {agent.command[0]} is not an executable program (not found"
                               f"{' on PATH' if '/' not in agent.command[0] else ''})")
    return AgentProgram(command=agent.command)


def _harness_player(agent: ExternalAgent) -> Any:
    from agentloop_grpc.harness.clis import HarnessError
    from agentloop_grpc.harness.player import HarnessPlayer, HarnessSettings
    from agentloop_grpc.harness.workspace import WorkspaceLimits, probe_cached

    assert agent.harness is not None
    if (why := probe_cached()) is not None:
        raise AgentConfigError(f"agent.harness: no sandbox for the workspaces: {why}")
    ws = agent.workspace
    limits = WorkspaceLimits(wall_timeout_s=ws.wall_timeout_s, cpu_seconds=ws.cpu_seconds,
                             memory_bytes=ws.memory_mib * 2**20, max_processes=ws.max_processes,
                             disk_bytes=ws.disk_mib * 2**20, output_bytes=ws.output_kib * 2**10)
    try:
        return HarnessPlayer(HarnessSettings(agent.harness, agent.gateway.model, agent.command or (), limits,
                                             agent.tests_reward, Path(ws.root),
                                             tuple(Path(p) for p in ws.read_only)))
    except HarnessError as error:
        raise AgentConfigError(str(error)) from None


def _resolve(field: str, path: str) -> Any:
    try:
        return ComponentSpec(path=path).resolve()
    except Exception as error:  # noqa: BLE001 - a user's module may raise anything as it imports
        raise AgentConfigError(f"{field}: {path} cannot be imported ({type(error).__name__}: {error})") from None


@contextlib.asynccontextmanager
async def agent_sessions(agent: ExternalAgent, program: AgentProgram, router: Router, model_dir: str | None,
                         loop: AgentLoopConfig, reward: ComponentSpec | None,
                         log_dir: Path | None) -> AsyncIterator[ExternalAgents]:
    """``agent``'s sessions through a gateway over ``router`` while the block lasts (the codec of the model in
    ``model_dir`` with ``loop``'s chat template unless the gateway config names one; ``reward`` scores sessions
    when the agent's reward is ``function``)."""
    from agentloop_grpc.gateway.in_process import serve_agents

    if agent.gateway.chat_template is not None:
        loop = loop.model_copy(update={"chat_template": agent.gateway.chat_template})
    codec = await asyncio.to_thread(load_codec, model_dir, loop)
    scorer = reward.load() if agent.reward == "function" and reward is not None else None
    async with serve_agents(router, codec, agent.gateway, program, reward=scorer,
                            max_concurrency=agent.max_concurrency, timeout_s=agent.timeout_s, log_dir=log_dir,
                            posted_reward=agent.reward == "session", select=agent.trajectory_selection) as agents:
        yield agents


def agent_row(sample: Sample, row: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a sample's agent gets as its row: the dataset row (None: none), with the sample's messages, sample_id,
    group_id and ground truth."""
    return {"ground_truth": sample.ground_truth, **(row or {}), "messages": list(sample.messages),
            "sample_id": sample.sample_id, "group_id": sample.group_id}


class GatewayPlayer:
    """See the module docstring. ``log_dir``: where a command agent's output goes, a file per session (None:
    discarded)."""

    def __init__(self, agent: ExternalAgent, reward: ComponentSpec | None, *, one_per_sample: bool = True,
                 log_dir: Path | None = None) -> None:
        self.agent, self.reward = agent, reward
        self.one_per_sample, self.log_dir = one_per_sample, log_dir
        self.program = check_agent(agent, reward)
        self.forked_chains = 0
        self._stack = AsyncExitStack()
        self._agents: ExternalAgents | None = None

    async def start(self, router: Router, model_dir: str | None, loop: AgentLoopConfig) -> None:
        self._agents = await self._stack.enter_async_context(
            agent_sessions(self.agent, self.program, router, model_dir, loop, self.reward, self.log_dir))

    async def play(self, samples: Sequence[Sample], rows: Sequence[Mapping[str, Any]] | None,
                   on_done: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        if self._agents is None:
            raise RuntimeError("the agent's sessions are not started")
        given = rows if rows is not None else [None] * len(samples)
        played = await self._agents.run(samples, [agent_row(s, r) for s, r in zip(samples, given, strict=True)],
                                        on_done)
        if not self.one_per_sample:
            return played
        kept: dict[str, Trajectory] = {}
        for t in played:  # a session's chains in order: its main chain first, unless the selection kept a fork
            kept.setdefault(t.sample_id.split("/fork-")[0], t)
        self.forked_chains += len(played) - len(kept)
        return [kept[sample.sample_id] for sample in samples]

    async def close(self) -> None:
        await self._stack.aclose()
        self._agents = None
