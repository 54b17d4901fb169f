"""An engine killed with SIGKILL in the middle of an agent's streamed request: the request completes on the other
engine (the Router's failover with resume) and the session's trajectory is token-exact."""

from __future__ import annotations

from contextlib import AsyncExitStack

import openai
import pytest

from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import GenerateResult, Router

from ..router.conftest import AGENTLOOP, ServerProcess
from ..router.test_failover import BUDGET, FAST, assert_resumed

pytestmark = pytest.mark.fault


async def test_sigkill_mid_stream_the_agents_request_completes_elsewhere_token_exact(codec, server_processes):
    # the fake with SmolLM2's vocabulary, so the prompts the gateway encodes are in it
    program = (AGENTLOOP, "engine", "serve", "--set", "vocab_size=49152")
    server_processes.extend(ServerProcess(token_latency_ms=5, program=program) for _ in range(2))
    async with AsyncExitStack() as stack:
        router = await stack.enter_async_context(Router([p.address for p in server_processes], FAST))
        await router.fleet.wait_ready(2)
        gateway = SessionGateway(router, codec, GatewayConfig(sampling=ForcedSampling(temperature=0.0)))
        url = await stack.enter_async_context(serve_app(create_app(gateway)))
        client = await stack.enter_async_context(openai.AsyncOpenAI(base_url=f"{url}/sessions/k1/v1", api_key="none"))
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=BUDGET,
            stream=True)
        text, chunks, victim, extension, finish = [], 0, None, None, None
        async for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
            extension = (chunk.model_extra or {}).get("agentloop") or extension
            chunks += 1
            if chunks == 30:  # well into the stream: kill the engine serving it
                victim = next(p for p in server_processes if p.address == router.session_server("k1"))
                victim.kill()
        _, (t,) = await gateway.finish("k1")
    survivor = next(p.address for p in server_processes if p is not victim)
    assert finish == "length" and len(t.response_ids) == BUDGET and set(t.response_mask) == {1}
    assert t.servers == (victim.address, survivor) and t.error is None and not t.infrastructure_failure
    assert extension["token_ids"] == list(t.response_ids)  # what the client was told is what was recorded
    assert "".join(text) == codec.decode(t.response_ids)
    # the first engine's tokens, then the survivor's continuation of the prompt and those tokens: nothing lost or
    # twice (the fake is deterministic for greedy requests)
    prompt = list(t.prompt_ids)
    result = GenerateResult(  # the trajectory's tokens, as the router test's check takes them
       "", "k1", t.response_ids, (), (), (), None, None, 0, 0, (), 1, 0.0)
    await assert_resumed(result, prompt, survivor)
