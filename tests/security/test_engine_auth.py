"""Bearer tokens on an engine server: every RPC but health needs the token, control RPCs the admin token; a call
without one, or with a wrong one, is refused and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.serving.server_security import ServerSecurity
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .conftest import ADMIN_TOKEN, TOKEN, Pki

pytestmark = pytest.mark.fault

RUNNING = engine_pb2.ENGINE_STATE_RUNNING


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[EngineServer]:
    security = ServerSecurity(token_file=str(pki.token), admin_token_file=str(pki.admin_token))
    engine_server = await create_server(FakeEngine(FakeEngineConfig(token_latency_s=0.01)), "127.0.0.1:0", security)
    await start_adapter(engine_server)
    yield engine_server
    await engine_server.stop(grace_s=0.5)


@pytest.fixture
async def channel(server: EngineServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def request(request_id: str, max_new_tokens: int = 4) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id, session_id="s", prompt_ids=[1, 2, 3],
        sampling_params=generation_pb2.SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True),
    )


async def state(channel: grpc.aio.Channel) -> engine_pb2.GetServerInfoResponse:
    control = engine_pb2_grpc.EngineControlStub(channel)
    return await control.GetServerInfo(engine_pb2.GetServerInfoRequest(), metadata=bearer(TOKEN), timeout=10)


async def error_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value.code()


async def test_health_is_open_to_everyone(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("metadata", [(), bearer("not-the-token"), (("authorization", TOKEN),)],
                         ids=["no-token", "wrong-token", "no-bearer-scheme"])
async def test_calls_without_the_token_are_unauthenticated_and_change_nothing(
    channel: grpc.aio.Channel, metadata
) -> None:
    generate = generation_pb2_grpc.TokenGenerateStub(channel)
    control = engine_pb2_grpc.EngineControlStub(channel)

    async def stream() -> None:
        async for _ in generate.Generate(request("denied"), metadata=metadata, timeout=10):
            pass

    async def weights():
        yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=7))

    before = await state(channel)
    calls = [
        stream(),
        generate.GetLoad(generation_pb2.GetLoadRequest(), metadata=metadata, timeout=10),
        generate.Abort(generation_pb2.AbortRequest(all=True), metadata=metadata, timeout=10),
        control.GetServerInfo(engine_pb2.GetServerInfoRequest(), metadata=metadata, timeout=10),
        control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_ABORT), metadata=metadata, timeout=10),
        control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE), metadata=metadata, timeout=10),
        control.UpdateWeights(weights(), metadata=metadata, timeout=10),
    ]
    for call in calls:
        assert await error_of(call) == grpc.StatusCode.UNAUTHENTICATED
    after = await state(channel)
    assert (after.state, after.weight_version) == (before.state, before.weight_version)
    assert after.state == RUNNING


async def test_user_token_generates_but_control_needs_the_admin_token(channel: grpc.aio.Channel) -> None:
    generate = generation_pb2_grpc.TokenGenerateStub(channel)
    control = engine_pb2_grpc.EngineControlStub(channel)
    user, admin = bearer(TOKEN), bearer(ADMIN_TOKEN)
    # a long generation in flight: the refused Abort(all) and Pause must not touch it
    running = generate.Generate(request("long", max_new_tokens=100), metadata=user, timeout=30)
    first = await running.read()
    assert isinstance(first, generation_pb2.GenerateResponse) and first.HasField("chunk")

    async def weights():
        yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(weight_version=7))

    denied = [
        generate.Abort(generation_pb2.AbortRequest(all=True), metadata=user, timeout=10),
        control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_ABORT), metadata=user, timeout=10),
        control.Sleep(engine_pb2.SleepRequest(level=engine_pb2.SLEEP_LEVEL_KV_CACHE), metadata=user, timeout=10),
        control.WakeUp(engine_pb2.WakeUpRequest(), metadata=user, timeout=10),
        control.Resume(engine_pb2.ResumeRequest(), metadata=user, timeout=10),
        control.FlushCache(engine_pb2.FlushCacheRequest(), metadata=user, timeout=10),
        control.UpdateWeights(weights(), metadata=user, timeout=10),
        control.LoadWeights(engine_pb2.LoadWeightsRequest(path="/etc"), metadata=user, timeout=10),
    ]
    for call in denied:
        assert await error_of(call) == grpc.StatusCode.PERMISSION_DENIED
    info = await state(channel)
    assert info.state == RUNNING and info.weight_version == 0
    # aborting one's own request by id is not a control call
    aborted = await generate.Abort(generation_pb2.AbortRequest(request_ids=["nobody"]), metadata=user, timeout=10)
    assert list(aborted.aborted_request_ids) == []
    last = first
    while (message := await running.read()) is not grpc.aio.EOF:
        assert isinstance(message, generation_pb2.GenerateResponse)
        last = message
    assert last.complete.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    # the admin token may do everything
    paused = await control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_ABORT), metadata=admin, timeout=10)
    assert paused.state == engine_pb2.ENGINE_STATE_PAUSED
    await control.Resume(engine_pb2.ResumeRequest(), metadata=admin, timeout=10)
    updated = await control.UpdateWeights(weights(), metadata=admin, timeout=10)
    assert updated.weight_version == 7


async def test_router_sends_the_right_token_to_each_call(server: EngineServer, pki: Pki) -> None:
    security = ClientSecurity(token_file=str(pki.token), admin_token_file=str(pki.admin_token))
    async with Router([f"127.0.0.1:{server.port}"], RouterConfig(security=security)) as router:
        result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=3, ignore_eos=True)))
        assert len(result.token_ids) == 3
        assert (await router.fleet.pause()).ok and (await router.fleet.resume()).ok
    user_only = ClientSecurity(token_file=str(pki.token))
    async with Router([f"127.0.0.1:{server.port}"], RouterConfig(security=user_only)) as router:
        result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=2, ignore_eos=True)))
        assert len(result.token_ids) == 2
        refused = await router.fleet.pause()
        assert not refused.ok and "PERMISSION_DENIED" in str(refused.errors)

