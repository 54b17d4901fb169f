"""A rollout played by an agent of your own (``agent:`` in the config) instead of our loops.

Steps: (1) the dataset, and the agent checked before anything starts (the callable imports, the command's program
exists, the reward function imports, the gateway extra is installed); (2-3) engines and tools, as for the loops;
(4) in this process: a Router over the engines, the session gateway over it (the codec of the engines' model, the
gateway config's tool-call format), its HTTP app served on a loopback port and locked with a token made for this
run, which no agent sees (each gets a key of its own session, gateway/agents.py), then every sample played as a
session (``samples_per_prompt`` sessions of a row share its GRPO group); (5) the same outputs as the loops'.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from agentloop_grpc.agent import Sample, Trajectory
from agentloop_grpc.agent.spec import ComponentSpec, load_codec
from agentloop_grpc.router import NoHealthyServerError, Router

from .config import RolloutConfig
from .dataset import read_rows, to_samples
from .progress import Progress
from .run import (
    LoopConfigError,
    RolloutError,
    RunRecord,
    end_run,
    open_tracking,
    sample_load,
    start_engines,
    start_tools,
)

if TYPE_CHECKING:
    from agentloop_grpc.gateway.agents import AgentProgram


def check_agent(config: RolloutConfig) -> AgentProgram:
    """The agent's program, or LoopConfigError (one line) when it cannot run: found before any server starts."""
    agent = config.agent
    assert agent is not None  # only called for a config with an agent
    try:
        from agentloop_grpc.gateway.agents import AgentProgram
        from agentloop_grpc.gateway.app import create_app  # noqa: F401 - FastAPI and uvicorn: the extra
    except ImportError as error:
        raise LoopConfigError(f"agent: the session gateway needs the 'gateway' extra (pip install "
                              f"'agentloop-grpc[gateway]'): {error}") from None
    if agent.reward == "function" and config.reward is not None:
        _resolve("reward", config.reward.path)
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


def _resolve(field: str, path: str) -> Any:
    try:
        return ComponentSpec(path=path).resolve()
    except Exception as error:  # noqa: BLE001 - a user's module may raise anything as it imports
        raise LoopConfigError(f"{field}: {path} cannot be imported ({type(error).__name__}: {error})") from None


def agent_rows(rows: list[dict[str, Any]], samples: list[Sample], samples_per_prompt: int) -> list[dict[str, Any]]:
    """What each sample's agent gets as its row: the dataset row, with the sample's messages (image paths made
    absolute), its sample_id and group_id."""
    return [{**rows[i // samples_per_prompt], "messages": list(sample.messages), "sample_id": sample.sample_id,
             "group_id": sample.group_id} for i, sample in enumerate(samples)]


async def run_agent_rollout(config: RolloutConfig, progress: Progress, record: RunRecord) -> RunRecord:
    """``run_rollout`` for a config with an agent."""
    agent = config.agent
    assert agent is not None
    out = record.output_dir
    out.mkdir(parents=True, exist_ok=True)
    # 1. the dataset and the agent, before anything starts
    rows = read_rows(config.dataset)
    samples = to_samples(rows, config.dataset, config.samples_per_prompt)
    program = check_agent(config)
    from agentloop_grpc.gateway.agents import ExternalAgents, SessionKeys
    from agentloop_grpc.gateway.app import create_app
    from agentloop_grpc.gateway.server import serve_app
    from agentloop_grpc.gateway.service import SessionGateway

    started = time.monotonic()
    async with AsyncExitStack() as stack:
        tracking = open_tracking(config, stack, record, progress)
        # 2-3. engines and tools
        progress.status("starting engine and tool servers")
        (addresses, model_dir), _ = await asyncio.gather(start_engines(config.engines, stack, out),
                                                         start_tools(config.tools, stack, out))
        record.servers = addresses
        # 4. the Router, the gateway and its app, the agents
        router = await stack.enter_async_context(Router(addresses, config.router))
        try:
            await router.fleet.wait_ready(min_servers=len(addresses), timeout_s=config.router.no_server_wait_s)
        except NoHealthyServerError:
            down = [a for a, e in router.fleet.servers.items() if not e.healthy]
            raise RolloutError(f"engine server(s) {', '.join(down)} did not answer as SERVING") from None
        loop = config.loop if agent.gateway.chat_template is None else \
            config.loop.model_copy(update={"chat_template": agent.gateway.chat_template})
        reward = config.reward.load() if agent.reward == "function" and config.reward is not None else None
        gateway = SessionGateway(router, load_codec(model_dir, loop), agent.gateway, reward=reward)
        token = secrets.token_urlsafe(32)
        keys = SessionKeys(token)
        app = create_app(gateway, user_token=token)
        keys.install(app)
        url = await stack.enter_async_context(serve_app(app))
        agents = ExternalAgents(gateway, url, keys, program, max_concurrency=agent.max_concurrency,
                                timeout_s=agent.timeout_s, log_dir=out / "logs" / "agents",
                                posted_reward=agent.reward == "session")
        progress.start(len(samples))
        sampler = asyncio.create_task(sample_load(router.metrics, record))

        def done(trajectory: Trajectory) -> None:
            record.trajectories.append(trajectory)
            progress.advance(trajectory)
            tracking.advance(trajectory, time.monotonic() - started)

        try:
            record.trajectories = await agents.run(
                samples, agent_rows(rows, samples, config.samples_per_prompt), on_done=done)  # the samples' order
        except asyncio.CancelledError:
            record.interrupted = True
            raise
        finally:
            sampler.cancel()
            end_run(config, record, router.metrics, tracking, progress, started)
    return record
