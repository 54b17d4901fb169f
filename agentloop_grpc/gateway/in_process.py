"""External agents served from this process: a session gateway over the caller's Router, its HTTP app on a
loopback port locked with a token made here, which no agent sees (each gets a key of its own session,
``agents.SessionKeys``), and the ``ExternalAgents`` that play samples through it. What ``agentloop rollout``,
TRL's ``AgentLoopRollout`` and verl's manager share when an agent of your own replaces our loops.

The gateway generates through the Router it is given, so it shares that Router's sessions, failover and weight
versions, and sees its pauses (``when_paused: retry``).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.agent.reward import RewardFunction
from agentloop_grpc.router import Router

from .agents import AgentProgram, ChainSelection, ExternalAgents, SessionKeys
from .app import create_app
from .config import GatewayConfig
from .server import serve_app
from .service import SessionGateway


@contextlib.asynccontextmanager
async def serve_agents(router: Router, codec: ChatCodec, config: GatewayConfig, program: AgentProgram, *,
                       reward: RewardFunction | None = None, max_concurrency: int = 32, timeout_s: float = 600.0,
                       log_dir: Path | None = None, posted_reward: bool = True,
                       select: ChainSelection = "all") -> AsyncIterator[ExternalAgents]:
    """Serve the gateway until the block ends; yields the agents to ``run`` samples with (see ``ExternalAgents``
    for the arguments; ``reward``: the gateway's reward function, for sessions whose agent posted none)."""
    gateway = SessionGateway(router, codec, config, reward=reward)
    await gateway.check_engines()
    token = secrets.token_urlsafe(32)
    keys = SessionKeys(token)
    app = create_app(gateway, user_token=token)
    keys.install(app)
    async with serve_app(app, limits=config.limits) as url:
        yield ExternalAgents(gateway, url, keys, program, max_concurrency=max_concurrency, timeout_s=timeout_s,
                             log_dir=log_dir, posted_reward=posted_reward, select=select)
