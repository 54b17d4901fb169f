"""An unmodified smolagents ``ToolCallingAgent`` (``OpenAIServerModel``) through the gateway, on a scripted fake
engine: its ``@tool`` calculator runs our calculator on a real tool server over gRPC, and the agent gets the
scripted ``final_answer``.

smolagents never echoes a call as an assistant ``tool_calls`` message nor its result as a ``tool`` message: its
memory re-renders the call as assistant TEXT (``Calling tools:\\n[{...}]``) and the result as a USER message
(``Observation:\\n...``). The next prompt therefore does not hold the tokens the model wrote, and the gateway is
right to fork a new chain at every step (appending would train on a context the model never saw): each chain is
one token-exact assistant turn, no drift.

``tool_choice``: smolagents sends ``required`` by default, which the gateway turns into a grammar forcing a call;
the fake engine has no structured output (400 "the fake engine does not support structured output"), so the model
here is given ``tool_choice="auto"`` (a constructor keyword smolagents documents; the scripted model calls anyway).
"""

from __future__ import annotations

import asyncio
import json

# smolagents ships no type information
from smolagents import OpenAIServerModel, ToolCallingAgent, tool  # type: ignore[import-untyped]

from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from ..agent.conftest import EOS, call
from .conftest import scripted_gateway
from .test_agents_sdk import calculator_server

QUESTION = "What is 17 * 23?"
REPLIES = [call("calculator", expression="17*23"), call("final_answer", answer="391")]
#: Greedy: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


async def test_a_smolagents_tool_calling_agent_gets_its_answer_and_each_step_is_a_token_exact_chain(codec):
    loop = asyncio.get_running_loop()
    executed: list[str] = []
    async with calculator_server() as tools, scripted_gateway(codec, REPLIES, GREEDY) as g:

        async def on_our_server(expression: str) -> str:
            instance = await tools.create_instance("calculator", "smolagents", {})
            try:
                result = await tools.execute(instance, json.dumps({"expression": expression}))
            finally:
                await tools.release(instance)
            assert not result.is_error, result.content
            executed.append(result.content)
            return result.content

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression.

            Args:
                expression: the expression, e.g. 2+3.
            """
            # smolagents is synchronous (run in a thread here): the gRPC client lives on the test's loop
            return asyncio.run_coroutine_threadsafe(on_our_server(expression), loop).result(timeout=30)

        def run() -> object:
            model = OpenAIServerModel(model_id="m", api_base=g.base_url("smol"), api_key="none", tool_choice="auto")
            agent = ToolCallingAgent(tools=[calculator], model=model, max_steps=3, verbosity_level=0)
            return agent.run(QUESTION)

        answer = await asyncio.to_thread(run)  # the sync client blocks: off the loop that serves it
        requests = list(g.script.requests)
        session, trajectories = await g.gateway.finish("smol")
    assert answer == "391"
    assert executed == ["391"] and len(requests) == 2
    second_prompt = codec.decode(requests[1].prompt_ids)
    # our tool server's result reached the model, as smolagents words it: the call as text, the result as a user
    assert "Calling tools:\n" in second_prompt and "<|im_start|>user\nObservation:\n391<|im_end|>" in second_prompt
    # the step's history re-rendered the call: a new chain, the reason said
    assert [f.reason for f in session.forks] == [
        "chain 0: history differs from the chain at message 2 (edited, compacted or dropped turns)"]
    assert [t.sample_id for t in trajectories] == ["smol", "smol/fork-1"]
    for t, reply, request in zip(trajectories, REPLIES, requests, strict=True):
        assert t.drift is None and t.error is None and not t.failed
        assert t.assistant_turns == 1 and list(t.prompt_ids) == list(request.prompt_ids)
        assert list(t.response_ids) == [*codec.encode(reply), EOS]  # the engine's tokens, exactly
        assert set(t.response_mask) == {1} and all(logprob != 0 for logprob in t.response_logprobs)
