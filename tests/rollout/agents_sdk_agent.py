"""An unmodified OpenAI Agents SDK agent, as `agentloop rollout` runs it (``agent: {callable: ...}``): an ``Agent``
with a calculator function tool it must call first (``tool_choice="required"``), on the SDK's Chat Completions
model pointed at the session's base URL; it posts
1.0 to its session's reward route when its final output holds the row's ground truth.

Tracing is off (for the process, and for each run): the SDK's exporter would post every run to api.openai.com.
"""

from __future__ import annotations

from typing import Any

import agents
import httpx
from openai import AsyncOpenAI

from agentloop_grpc.tools.builtin.calculator import calculator as evaluate

PATH = "tests.rollout.agents_sdk_agent"
MAX_TURNS = 2

agents.set_tracing_disabled(True)


@agents.function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. 17*23.
    """
    return str(evaluate(expression))


async def sdk_agent(base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> None:
    """One Runner.run of the agent on the row's last user message; a run out of turns ends as the SDK says."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    async with client:
        model = agents.OpenAIChatCompletionsModel(model="m", openai_client=client)
        # the first turn must call (the gateway forces it with a grammar); the SDK resets tool_choice once the tool
        # ran, so the second turn may answer
        agent = agents.Agent(name="calculator", instructions="Use the calculator tool, then answer.",
                             tools=[calculator], model=model,
                             model_settings=agents.ModelSettings(tool_choice="required"))
        try:
            result = await agents.Runner.run(agent, row["messages"][-1]["content"], max_turns=MAX_TURNS,
                                             run_config=agents.RunConfig(tracing_disabled=True))
            answer = str(result.final_output)
        except agents.MaxTurnsExceeded:  # the model kept calling: the turns it had are the trajectory
            answer = ""
    async with httpx.AsyncClient() as http:
        posted = await http.post(base_url.removesuffix("/v1") + "/reward",
                                 headers={"Authorization": f"Bearer {api_key}"},
                                 json={"reward": 1.0 if row["ground_truth"] in answer else 0.0})
        posted.raise_for_status()
