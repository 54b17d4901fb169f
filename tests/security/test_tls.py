"""TLS with real certificates: engine servers with a server certificate (and client certificates for mTLS), the
Router and the tool client verifying them; plaintext or unknown-CA clients cannot connect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from agentloop_grpc.channels import open_channel
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.serving.server_security import ServerSecurity
from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError
from agentloop_grpc.tools.config import load_config
from agentloop_grpc.tools.server import create_tool_server
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc

from .conftest import BUILTIN_TOOLS, Pki

pytestmark = pytest.mark.fault

PARAMS = SamplingParams(max_new_tokens=3, ignore_eos=True)


@asynccontextmanager
async def engine_server(security: ServerSecurity) -> AsyncIterator[EngineServer]:
    server = await create_server(FakeEngine(FakeEngineConfig()), "127.0.0.1:0", security)
    await start_adapter(server)
    try:
        yield server
    finally:
        await server.stop(grace_s=0.5)


async def server_info(address: str, security: ClientSecurity | None) -> engine_pb2.GetServerInfoResponse:
    async with open_channel(address, security) as channel:
        stub = engine_pb2_grpc.EngineControlStub(channel)
        return await stub.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=5, wait_for_ready=False)


async def refused(address: str, security: ClientSecurity | None) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await server_info(address, security)
    return raised.value.code()


async def test_tls_server_is_reached_only_by_clients_that_trust_its_ca(pki: Pki) -> None:
    async with engine_server(ServerSecurity(cert_file=str(pki.server_cert), key_file=str(pki.server_key))) as server:
        address = f"127.0.0.1:{server.port}"
        info = await server_info(address, ClientSecurity(ca_file=str(pki.ca)))
        assert info.state == engine_pb2.ENGINE_STATE_RUNNING
        # by host name too (the certificate names localhost and 127.0.0.1)
        assert (await server_info(f"localhost:{server.port}", ClientSecurity(ca_file=str(pki.ca)))).model_id
        assert await refused(address, None) == grpc.StatusCode.UNAVAILABLE  # plaintext to a TLS port
        assert await refused(address, ClientSecurity(ca_file=str(pki.rogue_ca))) == grpc.StatusCode.UNAVAILABLE
        # a name the certificate does not carry
        wrong_name = ClientSecurity(ca_file=str(pki.ca), server_name="engine.example.com")
        assert await refused(address, wrong_name) == grpc.StatusCode.UNAVAILABLE
        async with Router([address], RouterConfig(security=ClientSecurity(ca_file=str(pki.ca)))) as router:
            assert len((await router.generate(GenerateCall("s", [1, 2, 3], PARAMS))).token_ids) == 3


async def test_mtls_needs_a_client_certificate_from_the_configured_ca(pki: Pki) -> None:
    security = ServerSecurity(cert_file=str(pki.server_cert), key_file=str(pki.server_key),
                              client_ca_file=str(pki.ca))
    async with engine_server(security) as server:
        address = f"127.0.0.1:{server.port}"
        mine = ClientSecurity(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        assert (await server_info(address, mine)).state == engine_pb2.ENGINE_STATE_RUNNING
        assert await refused(address, ClientSecurity(ca_file=str(pki.ca))) == grpc.StatusCode.UNAVAILABLE
        rogue = ClientSecurity(ca_file=str(pki.ca), cert_file=str(pki.rogue_client_cert),
                               key_file=str(pki.rogue_client_key))
        assert await refused(address, rogue) == grpc.StatusCode.UNAVAILABLE


async def test_tool_server_with_tls_and_token(pki: Pki) -> None:
    security = ServerSecurity(cert_file=str(pki.server_cert), key_file=str(pki.server_key),
                              token_file=str(pki.token))
    server = await create_tool_server(load_config(BUILTIN_TOOLS), "127.0.0.1:0", security)
    address = f"127.0.0.1:{server.port}"
    trusted = ClientSecurity(ca_file=str(pki.ca), token_file=str(pki.token))
    client = GrpcToolClient(address, timeout_s=30, security=trusted)
    tokenless = GrpcToolClient(address, timeout_s=30, security=ClientSecurity(ca_file=str(pki.ca)))
    try:
        instance = await client.create_instance("calculator", "t1")
        result = await client.execute(instance, '{"expression": "6 * 7"}')
        assert "42" in result.content and not result.is_error
        with pytest.raises(ToolInfrastructureError, match="UNAUTHENTICATED"):
            await tokenless.list_tools()
    finally:
        await client.close()
        await tokenless.close()
        await server.stop(grace_s=1)


def test_client_security_implies_tls_and_rejects_half_pairs(pki: Pki) -> None:
    assert ClientSecurity(ca_file=str(pki.ca)).tls
    assert not ClientSecurity(token_file=str(pki.token)).tls
    with pytest.raises(ValueError, match="cert_file and key_file"):
        ClientSecurity(cert_file=str(pki.client_cert))
    with pytest.raises(ValueError, match="certificate and its key"):
        ServerSecurity(cert_file=str(pki.server_cert))
    with pytest.raises(ValueError, match="not set"):
        ClientSecurity(token_env="AGENTLOOP_TEST_UNSET_TOKEN").tokens()
