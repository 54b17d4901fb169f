"""Agents of a user's own, as `agentloop rollout` runs them through the session gateway (``agent:``): the real
``openai`` SDK asking the model, running the calculator it calls itself, and posting a reward for the answer.

What an agent does is its row's ``behaviour``: ``answer`` (default), ``hang`` (past any timeout), ``raise``,
``stall`` (hangs after the first turn), ``exit`` (a command ending with code 1 before asking anything), ``silent``
(ends without asking the model).
Run as a script it is a command agent, reading its session from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import openai

PATH = "tests.rollout.external_agent"
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}}]


def _calculate(expression: str) -> str:
    left, _, right = expression.partition("+")
    return str(int(left) + int(right))


def _reward_url(base_url: str) -> str:
    return base_url.removesuffix("/v1") + "/reward"


async def tool_agent(base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> None:
    """A two-turn tool conversation (async); posts 1.0 when the answer holds the ground truth."""
    behaviour = row.get("behaviour", "answer")
    if behaviour == "hang":
        await asyncio.sleep(3600)
    if behaviour == "raise":
        raise ValueError(f"the agent of {session_id} gave up")
    if behaviour == "silent":
        return
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(row["messages"])
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = first.choices[0].message
        if behaviour == "stall":  # hangs once the model answered
            await asyncio.sleep(3600)
        assert message.tool_calls is not None
        (call,) = message.tool_calls
        result = _calculate(json.loads(call.function.arguments)["expression"])
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": result}]
        second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    answer = second.choices[0].message.content or ""
    async with httpx.AsyncClient() as http:
        posted = await http.post(_reward_url(base_url), headers={"Authorization": f"Bearer {api_key}"},
                                 json={"reward": 1.0 if row["ground_truth"] in answer else 0.25})
        posted.raise_for_status()


async def forking_agent(base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> dict[str, str]:
    """Three chains, as an agent that restarts and runs a sub-agent: the row's question with its tool turn (the
    longest), then two unrelated one-turn questions; tells what it did as metadata."""
    await tool_agent(base_url, api_key, row, session_id)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        for question in ("Sub-agent: 1 + 1?", "Sub-agent: 2 + 2?"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
    return {"chains_started": "3"}


def sync_agent(base_url: str, api_key: str, row: dict[str, Any], session_id: str) -> None:
    """One turn with the synchronous client (run in a thread); hangs or raises as its row says."""
    behaviour = row.get("behaviour", "answer")
    if behaviour == "hang":
        time.sleep(30)  # a thread cannot be stopped: it ends by itself, long after its session
    if behaviour == "raise":
        raise ValueError(f"the agent of {session_id} gave up")
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        client.chat.completions.create(model="m", messages=row["messages"])


def main() -> None:
    """The command agent: the session's URLs and key from the environment, as an unmodified agent finds them."""
    row = json.loads(os.environ["AGENTLOOP_ROW"])
    behaviour = row.get("behaviour", "answer")
    print(f"session {os.environ['AGENTLOOP_SESSION_ID']}: {behaviour}", flush=True)
    if behaviour == "exit":
        sys.exit(1)
    if behaviour == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"child {child.pid}", flush=True)  # the test checks it dies with its parent's process group
        time.sleep(3600)
    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY
    reply = client.chat.completions.create(model="m", messages=row["messages"])
    answer = reply.choices[0].message.content or ""
    httpx.post(os.environ["AGENTLOOP_REWARD_URL"], headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
               json={"reward": 1.0 if row["ground_truth"] in answer else 0.0}).raise_for_status()


def exact_answer(outcome: Any) -> float:
    """The rollout's reward function: 1.0 when the last message holds the ground truth."""
    return 1.0 if outcome.sample.ground_truth in (outcome.messages[-1].get("content") or "") else 0.0


if __name__ == "__main__":
    main()


def judge_of_fives(outcome: Any) -> float:
    """A reward function that cannot judge anything but 5."""
    if outcome.sample.ground_truth != "5":
        raise RuntimeError(f"no judge for {outcome.sample.ground_truth}")
    return exact_answer(outcome)
