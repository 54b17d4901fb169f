"""``agentloop gateway``: the session gateway over running engine servers, until SIGTERM or SIGINT."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from agentloop_grpc.agent.config import AgentLoopConfig
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.router import Router, RouterConfig
from agentloop_grpc.serving.server import stop_signal
from agentloop_grpc.serving.server_security import ServerSecurity

from .app import create_app
from .config import GatewayConfig
from .server import serve_app
from .service import SessionGateway


async def serve_gateway(
    config: GatewayConfig,
    engines: Sequence[str],
    host: str,
    port: int,
    model_dir: str | None = None,
    security: ServerSecurity | None = None,
    router: RouterConfig | None = None,
    on_listening: Callable[[str], None] | None = None,
    discovery_file: str | Path | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; ``on_listening(base_url)`` once bound. The tokenizer is the model's
    (``model_dir``; None: the default model), with the config's chat template. ``discovery_file``: the launcher's
    file ``engines`` came from, followed while serving (a server restarted elsewhere joins)."""
    security = security or ServerSecurity()
    if security.client_ca_file is not None:
        raise ValueError("the gateway takes no client certificates (--tls-client-ca): use its tokens")
    user_token, admin_token = security.tokens()
    stop = stop_signal()
    codec = load_codec(model_dir, AgentLoopConfig(chat_template=config.chat_template))
    async with AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(Router(list(engines), router or RouterConfig(), discovery_file))
        gateway = SessionGateway(fleet, codec, config)
        await gateway.check_engines()  # an engine that cannot serve the config's turns is refused before serving
        app = create_app(gateway, user_token, admin_token)
        url = await stack.enter_async_context(serve_app(
            app, host, port, security.cert_file, security.key_file, config.limits))
        if on_listening is not None:
            on_listening(url)
        await stop.wait()
