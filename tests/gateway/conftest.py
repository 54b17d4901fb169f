"""Gateway fixtures: a real fake-engine server whose replies are scripted as text (tests/agent's TextScript), a
Router, the session gateway over them, and its HTTP app served by uvicorn on a loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import openai

from agentloop_grpc.agent import ChatCodec
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import Router, RouterConfig

# fixtures of other folders the gateway's tests take, registered here rather than imported by each test module
from ..agent.conftest import TextScript, codec, scripted_engine
from ..agent.test_embedded_rollout import embedded_server
from ..router.conftest import server_processes
from ..security.conftest import pki

__all__ = ["GatewayHarness", "codec", "embedded_server", "pki", "scripted_gateway", "server_processes"]


@dataclass
class GatewayHarness:
    url: str
    gateway: SessionGateway
    script: TextScript
    router: Router
    engine: str
    #: What the gateway's block closes on exit: the SDK clients opened below, before the server stops.
    stack: AsyncExitStack

    def base_url(self, session_id: str) -> str:
        """What an OpenAI client takes as base_url for this session."""
        return f"{self.url}/sessions/{session_id}/v1"

    def anthropic_base_url(self, session_id: str) -> str:
        """What an Anthropic client takes as base_url (it adds /v1/messages itself)."""
        return f"{self.url}/sessions/{session_id}"

    def openai(self, session_id: str, **options: Any) -> openai.AsyncOpenAI:
        """The openai SDK's async client for this session (``options``: its own, api_key "none" unless given),
        closed when the gateway's block ends."""
        client = openai.AsyncOpenAI(base_url=self.base_url(session_id), **{"api_key": "none", **options})
        self.stack.push_async_callback(client.close)
        return client

    def anthropic(self, session_id: str, **options: Any) -> anthropic.AsyncAnthropic:
        """The anthropic SDK's async client for this session, as ``openai``."""
        client = anthropic.AsyncAnthropic(base_url=self.anthropic_base_url(session_id),
                                          **{"api_key": "none", **options})
        self.stack.push_async_callback(client.close)
        return client


@asynccontextmanager
async def scripted_gateway(
    codec: ChatCodec, replies: Sequence[str] | Callable[[str], str], config: GatewayConfig | None = None,
    user_token: str | None = None, admin_token: str | None = None, engine: dict | None = None,
    tls: tuple[str, str] | None = None, gateway_class: type[SessionGateway] = SessionGateway,
) -> AsyncIterator[GatewayHarness]:
    """``tls``: (certificate, key) files to serve HTTPS with; ``gateway_class``: a SessionGateway that misbehaves on
    purpose, for the app's answer to it."""
    script = TextScript(codec, replies)
    async with AsyncExitStack() as stack:
        address = await stack.enter_async_context(scripted_engine(script, **(engine or {})))
        router = await stack.enter_async_context(Router([address], RouterConfig(no_server_wait_s=1)))
        await router.fleet.wait_ready()
        gateway = gateway_class(router, codec, config or GatewayConfig())
        url = await stack.enter_async_context(serve_app(create_app(gateway, user_token, admin_token),
                                                        certificate=tls and tls[0], private_key=tls and tls[1],
                                                        limits=gateway.config.limits))
        yield GatewayHarness(url, gateway, script, router, address, stack)
