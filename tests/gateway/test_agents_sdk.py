"""An unmodified OpenAI Agents SDK agent (``openai-agents``, its Chat Completions model) through the gateway, on a
scripted fake engine: its function tool runs our calculator on a real tool server over gRPC, the result reaches
the model, and the session records ONE token-exact chain (the SDK's echo of the call appends to it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import agents
import pytest
from openai import AsyncOpenAI

from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import load_config
from agentloop_grpc.tools.server import create_tool_server

from ..agent.conftest import EOS, call
from .conftest import scripted_gateway

QUESTION = "What is 17 * 23?"
ANSWER = "17 * 23 is 391."
REPLIES = [call("calculator", expression="17*23"), ANSWER]
#: Greedy: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


#: Nothing leaves the machine: the SDK's trace exporter would post every run to api.openai.com (left off for the
#: process: turning it back on would export the traces of any later Agents SDK test).
agents.set_tracing_disabled(True)
NO_TRACING = agents.RunConfig(tracing_disabled=True)


@asynccontextmanager
async def calculator_server() -> AsyncIterator[GrpcToolClient]:
    """Our tool server on a loopback port, serving the built-in tools, and a gRPC client to it."""
    server = await create_tool_server(load_config("builtin"), "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=30)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(grace_s=1)


def calculator_agent(tools: GrpcToolClient, client: AsyncOpenAI, executed: list[str]) -> agents.Agent:
    """An Agents SDK agent on ``client`` whose calculator tool asks our tool server; ``executed`` collects the
    results."""

    @agents.function_tool
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. 2+3.
        """
        instance = await tools.create_instance("calculator", "agents-sdk", {})
        try:
            result = await tools.execute(instance, json.dumps({"expression": expression}))
        finally:
            await tools.release(instance)
        assert not result.is_error, result.content
        executed.append(result.content)
        return result.content

    model = agents.OpenAIChatCompletionsModel(model="m", openai_client=client)
    return agents.Agent(name="calc", instructions="You are a careful calculator.", tools=[calculator], model=model)


async def run_agent(agent: agents.Agent, streamed: bool) -> object:
    """The agent's final output, from ``Runner.run`` or (``streamed``) ``Runner.run_streamed``, as a user runs it."""
    if not streamed:
        return (await agents.Runner.run(agent, QUESTION, max_turns=3, run_config=NO_TRACING)).final_output
    result = agents.Runner.run_streamed(agent, QUESTION, max_turns=3, run_config=NO_TRACING)
    async for _ in result.stream_events():
        pass
    return result.final_output


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agents_sdk_agent_with_a_tool_on_our_tool_server_records_one_token_exact_chain(codec, streamed):
    executed: list[str] = []
    async with calculator_server() as tools, scripted_gateway(codec, REPLIES, GREEDY) as g:
        agent = calculator_agent(tools, g.openai("sdk", max_retries=0), executed)
        assert await run_agent(agent, streamed) == ANSWER
        requests = list(g.script.requests)
        session, trajectories = await g.gateway.finish("sdk")
    # the tool server ran the call, and its result reached the model in the second turn's prompt
    assert executed == ["391"]
    assert len(requests) == 2
    second_prompt = codec.decode(requests[1].prompt_ids)
    assert "391" in second_prompt and "391" not in codec.decode(requests[0].prompt_ids)
    assert "You are a careful calculator." in second_prompt  # the agent's instructions: its system message
    # one chain: the SDK's echo of the assistant's call and the tool result appended to it
    assert session.forks == []
    (t,) = trajectories
    assert t.drift is None and t.error is None and not t.failed
    assert t.assistant_turns == 2 and t.tool_calls == 1
    assert set(t.response_mask) == {0, 1}
    model = [i for i, m in zip(t.response_ids, t.response_mask, strict=True) if m]
    assert model == [*codec.encode(REPLIES[0]), EOS, *codec.encode(ANSWER), EOS]  # the engine's tokens, exactly
    # the masked-out tokens are the tool turn, holding our tool server's result
    assert "391" in codec.decode([i for i, m in zip(t.response_ids, t.response_mask, strict=True) if not m])
    assert len(t.response_logprobs) == len(t.response_ids)
    for m, logprob in zip(t.response_mask, t.response_logprobs, strict=True):
        assert (logprob != 0) == (m == 1), (m, logprob)
    # the prompt is the first request's, exactly: the engine saw what is recorded
    assert list(t.prompt_ids) == list(requests[0].prompt_ids)
