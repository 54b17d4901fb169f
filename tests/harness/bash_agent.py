"""A minimal coding agent of our own, run by the ``command`` harness: the openai SDK asks the model with one
``bash`` tool, runs what it calls in the workspace, answers with the output, until the model calls nothing."""

from __future__ import annotations

import json
import os
import subprocess

import openai
from openai.types.chat import ChatCompletionFunctionToolParam

BASH: ChatCompletionFunctionToolParam = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the repository.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}}


def main() -> None:
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: the trajectory's session
    messages: list = [{"role": "user", "content": os.environ["AGENTLOOP_INSTRUCTION"]}]
    for _ in range(8):
        reply = client.chat.completions.create(model="agentloop", messages=messages, tools=[BASH]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return
        for call in reply.tool_calls:
            command = json.loads(call.function.arguments)["command"]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": done.stdout + done.stderr})


if __name__ == "__main__":
    main()
