"""A rollout played by an agent of your own (``agent:`` in the config) instead of our loops.

Steps: (1) the dataset, and the agent checked before anything starts (the callable imports, the command's program
exists, the reward function imports, the gateway extra is installed); (2-3) engines and tools, as for the loops;
(4) in this process: a Router over the engines, the session gateway over it (``agent_sessions``: the codec of the
engines' model, the gateway config's tool-call format, served as gateway/in_process.py says), then every sample
played as a session (``samples_per_prompt`` sessions of a row share its GRPO group); (5) the same outputs as the
loops'. ``check_agent`` and ``agent_sessions`` also serve TRL's AgentLoopRollout and verl's manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop_grpc.agent import AgentLoopConfig, Sample, Trajectory
from agentloop_grpc.agent.spec import ComponentSpec, load_codec
from agentloop_grpc.router import Router

from .config import ExternalAgent, RolloutConfig
from .dataset import read_rows, to_samples
from .progress import Progress
from .run import (
    LoopConfigError,
    RunRecord,
    collecting,
    engine_source,
    open_tracking,
    routing,
    start_servers,
    wait_engines,
)

if TYPE_CHECKING:
    from agentloop_grpc.gateway.agents import AgentProgram, ExternalAgents


def check_agent(agent: ExternalAgent, reward: ComponentSpec | None) -> AgentProgram:
    """The agent's program, or LoopConfigError (one line) when it cannot run: found before any server starts
    (``reward``: the run's reward function, imported when the agent's reward is ``function``)."""
    try:
        from agentloop_grpc.gateway.agents import AgentProgram
        from agentloop_grpc.gateway.app import create_app  # noqa: F401 - FastAPI and uvicorn: the extra
    except ImportError as error:
        raise LoopConfigError(f"agent: the session gateway needs the 'gateway' extra (pip install "
                              f"'agentloop-grpc[gateway]'): {error}") from None
    if agent.reward == "function" and reward is not None:
        _resolve("reward", reward.path)
    if agent.verifiers is not None:
        from agentloop_grpc.integrations.verifiers.environment import VerifiersError, load_environment
        from agentloop_grpc.integrations.verifiers.player import EnvironmentPlayer

        try:
            return AgentProgram(function=EnvironmentPlayer(load_environment(agent.verifiers), agent.gateway.model).play)
        except VerifiersError as error:
            raise LoopConfigError(f"dataset.verifiers: {error}") from None
    if agent.harness is not None:
        return AgentProgram(function=_harness_player(agent).play)
    if agent.callable is not None:
        function = _resolve("agent.callable", agent.callable)
        if not callable(function):
            raise LoopConfigError(f"agent.callable: {agent.callable} is a {type(function).__name__}, not a function")
        return AgentProgram(function=function)
    assert agent.command is not None  # the config has one of the two
    if shutil.which(agent.command[0]) is None:
        raise LoopConfigError(f"agent.command: {agent.command[0]} is not an executable program (not found"
                              f"{' on PATH' if '/' not in agent.command[0] else ''})")
    return AgentProgram(command=agent.command)


def _harness_player(agent: ExternalAgent) -> Any:
    from agentloop_grpc.harness.clis import HarnessError
    from agentloop_grpc.harness.player import HarnessPlayer, HarnessSettings
    from agentloop_grpc.harness.workspace import WorkspaceLimits, probe_cached

    assert agent.harness is not None
    if (why := probe_cached()) is not None:
        raise LoopConfigError(f"agent.harness: no sandbox for the workspaces: {why}")
    ws = agent.workspace
    limits = WorkspaceLimits(wall_timeout_s=ws.wall_timeout_s, cpu_seconds=ws.cpu_seconds,
                             memory_bytes=ws.memory_mib * 2**20, max_processes=ws.max_processes,
                             disk_bytes=ws.disk_mib * 2**20, output_bytes=ws.output_kib * 2**10)
    try:
        return HarnessPlayer(HarnessSettings(agent.harness, agent.gateway.model, agent.command or (), limits,
                                             agent.tests_reward, Path(ws.root),
                                             tuple(Path(p) for p in ws.read_only)))
    except HarnessError as error:
        raise LoopConfigError(str(error)) from None


def _resolve(field: str, path: str) -> Any:
    try:
        return ComponentSpec(path=path).resolve()
    except Exception as error:  # noqa: BLE001 - a user's module may raise anything as it imports
        raise LoopConfigError(f"{field}: {path} cannot be imported ({type(error).__name__}: {error})") from None


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


def agent_rows(rows: list[dict[str, Any]], samples: list[Sample], samples_per_prompt: int) -> list[dict[str, Any]]:
    """Each sample's ``agent_row`` (image paths made absolute in its messages)."""
    return [agent_row(sample, rows[i // samples_per_prompt]) for i, sample in enumerate(samples)]


class AgentPlayers:
    """An agent of your own playing samples for a trainer that takes one completion per prompt (TRL, verl): its
    program checked when made (LoopConfigError), its sessions served over the manager's Router from ``start`` to
    ``close``; ``play`` gives each sample's main chain, or the one ``trajectory_selection`` kept (every session has
    one: a failed trajectory stands for a session without chains), and counts the others in ``forked_chains``,
    not trained on."""

    def __init__(self, agent: ExternalAgent, reward: ComponentSpec | None) -> None:
        self.agent, self.reward = agent, reward
        self.program = check_agent(agent, reward)
        self.forked_chains = 0
        self._stack = AsyncExitStack()
        self._agents: ExternalAgents | None = None

    async def start(self, router: Router, model_dir: str | None, loop: AgentLoopConfig) -> None:
        self._agents = await self._stack.enter_async_context(
            agent_sessions(self.agent, self.program, router, model_dir, loop, self.reward, log_dir=None))

    async def play(self, samples: Sequence[Sample], rows: Sequence[Mapping[str, Any]],
                   on_done: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        if self._agents is None:
            raise RuntimeError("the agent's sessions are not started")
        played = await self._agents.run(samples, rows, on_done)
        kept: dict[str, Trajectory] = {}
        for t in played:  # a session's chains in order: its main chain first, unless the selection kept a fork
            kept.setdefault(t.sample_id.split("/fork-")[0], t)
        self.forked_chains += len(played) - len(kept)
        return [kept[sample.sample_id] for sample in samples]

    async def close(self) -> None:
        await self._stack.aclose()
        self._agents = None


async def run_agent_rollout(config: RolloutConfig, progress: Progress, record: RunRecord) -> RunRecord:
    """``run_rollout`` for a config with an agent."""
    agent = config.agent
    assert agent is not None
    out = record.output_dir
    out.mkdir(parents=True, exist_ok=True)
    # 1. the dataset and the agent, before anything starts
    rows = read_rows(config.dataset)
    samples = to_samples(rows, config.dataset, config.samples_per_prompt)
    program = check_agent(agent, config.reward_function)
    started = time.monotonic()
    async with AsyncExitStack() as stack:
        tracking = open_tracking(config, stack, record, progress)
        addresses, model_dir, _ = await start_servers(config, stack, record, progress)
        # 4. the Router, the gateway and its app, the agents
        engines, discovery_file = engine_source(config.engines, addresses, out)
        router = await stack.enter_async_context(
            Router.from_discovery_file(discovery_file, routing(config)) if discovery_file is not None
            else Router(engines, routing(config)))
        await wait_engines(router.fleet, addresses, config.router.no_server_wait_s)
        agents = await stack.enter_async_context(agent_sessions(agent, program, router, model_dir, config.loop,
                                                                config.reward_function, out / "logs" / "agents"))
        async with collecting(config, record, router.fleet, tracking, progress, started, len(samples)) as done:
            record.trajectories = await agents.run(
                samples, agent_rows(rows, samples, config.samples_per_prompt), on_done=done)  # the samples' order
    return record
