"""The gateway on the real default model (embedded engine, SmolLM2): an agent using the openai SDK, with the tool
call forced by tool_choice, records exactly the trajectory our tool loop records for the same conversation."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import openai
import pytest

from agentloop_grpc.agent import AgentLoopConfig, LoopContext, LoopRegistry, Sample, SamplingConfig
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import Router

from ..agent.conftest import local_tools

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 17 * 23? Use the calculator."}]


async def test_an_sdk_agent_on_smollm2_records_what_the_tool_loop_records(embedded_server, codec):
    tools = local_tools()
    try:
        specs = {s.name: s for s in await tools.list_tools()}
        offered = [specs["calculator"].openai()]
        config = AgentLoopConfig(constrain_tool_calls=True, max_assistant_turns=2, max_new_tokens_per_turn=64,
                                 max_parallel_tool_calls=1, sampling=SamplingConfig(temperature=0.0))
        async with AsyncExitStack() as stack:
            router = await stack.enter_async_context(Router([embedded_server]))
            await router.fleet.wait_ready()
            context = LoopContext(generator=router, codec=codec, config=config, tools=tools, tool_specs=specs)
            expected = await LoopRegistry.default(context).get("tool").run(
                Sample(sample_id="loop", messages=tuple(QUESTION), tools=("calculator",)))
            gateway = SessionGateway(router, codec, GatewayConfig(sampling=ForcedSampling(temperature=0.0)))
            url = await stack.enter_async_context(serve_app(create_app(gateway)))
            client = await stack.enter_async_context(openai.AsyncOpenAI(base_url=f"{url}/sessions/agent/v1",
                                                                         api_key="none"))
            history = list(QUESTION)
            for _ in range(2):  # the agent: ask, run the calls it gets, ask again
                reply = await client.chat.completions.create(model="m", messages=history, tools=offered,
                                                             tool_choice="required", max_tokens=64)
                message = reply.choices[0].message
                history.append(message.model_dump(exclude_none=True))
                for tool_call in message.tool_calls or []:
                    instance = await tools.create_instance("calculator", "agent", {})
                    result = await tools.execute(instance, tool_call.function.arguments, tool_call.id)
                    # as our tool loop words a tool's error, so both conversations are the same
                    content = f"Error ({result.error_kind.value}): {result.content}" if result.is_error \
                        else result.content
                    history.append({"role": "tool", "tool_call_id": tool_call.id, "content": content})
            session, (t,) = await gateway.finish("agent")
    finally:
        await tools.close()
    assert expected.tool_calls == 2 and json.loads(history[1]["tool_calls"][0]["function"]["arguments"])
    assert session.forks == [] and t.assistant_turns == 2 and t.error is None
    # the 135M model may write a non-canonical tokenization of its own text: recorded alike by both (the ids are the
    # truth), never a text drift
    assert t.drift == expected.drift and (t.drift is None or t.drift.kind == "tokenization")
    assert t.constrained and expected.constrained  # every turn forced by the grammar, as the loop constrains
    assert t.prompt_ids == expected.prompt_ids
    assert t.response_ids == expected.response_ids
    assert t.response_mask == expected.response_mask
    assert t.response_logprobs == pytest.approx(expected.response_logprobs, abs=1e-4)
