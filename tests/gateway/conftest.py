"""Gateway fixtures: a real fake-engine server whose replies are scripted as text (tests/agent's TextScript), a
Router, the session gateway over them, and its HTTP app served by uvicorn on a loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from agentloop_grpc.agent import ChatCodec
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import Router, RouterConfig

from ..agent.conftest import TextScript, codec, scripted_engine  # noqa: F401 - codec is a fixture

__all__ = ["GatewayHarness", "codec", "scripted_gateway"]


@dataclass
class GatewayHarness:
    url: str
    gateway: SessionGateway
    script: TextScript
    router: Router
    engine: str

    def base_url(self, session_id: str) -> str:
        """What an OpenAI client takes as base_url for this session."""
        return f"{self.url}/sessions/{session_id}/v1"

    def anthropic_base_url(self, session_id: str) -> str:
        """What an Anthropic client takes as base_url (it adds /v1/messages itself)."""
        return f"{self.url}/sessions/{session_id}"


@asynccontextmanager
async def scripted_gateway(
    codec: ChatCodec, replies: Sequence[str] | Callable[[str], str], config: GatewayConfig | None = None,
    user_token: str | None = None, admin_token: str | None = None, engine: dict | None = None,
    tls: tuple[str, str] | None = None,
) -> AsyncIterator[GatewayHarness]:
    """``tls``: (certificate, key) files to serve HTTPS with."""
    script = TextScript(codec, replies)
    async with AsyncExitStack() as stack:
        address = await stack.enter_async_context(scripted_engine(script, **(engine or {})))
        router = await stack.enter_async_context(Router([address], RouterConfig(no_server_wait_s=1)))
        await router.fleet.wait_ready()
        gateway = SessionGateway(router, codec, config or GatewayConfig())
        url = await stack.enter_async_context(serve_app(create_app(gateway, user_token, admin_token),
                                                        certificate=tls and tls[0], private_key=tls and tls[1]))
        yield GatewayHarness(url, gateway, script, router, address)
