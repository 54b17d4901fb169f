"""verl's own ``ToolAgentLoop``, unchanged, on our engines through ``AgentloopLLMClient`` with a verl tool (a
``BaseTool`` subclass): the model's turns it records are the engines' ids and logprobs, its response mask is 1 on
exactly those and 0 on the tool response. The 135M model does not call tools on its own, so the first turn is the
fake engine's scripted tool call (ids and logprobs still the engine's, over gRPC) and the turn after the tool
answer is the real model's, on the embedded engine."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.llm_server import LLMServerClient

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.verl.client import AgentloopLLMClient
from agentloop_grpc.router import GenerateCall, Router

#: The tool's schema as verl's tool config files give it (``tool_schema``).
ADD_SCHEMA = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]},
}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
#: ``actor_rollout_ref.rollout`` as far as verl's tool loop reads it (``multi_turn``, lengths, determinism).
MULTI_TURN = {"max_user_turns": 2, "max_assistant_turns": 3, "max_parallel_calls": 1,
              "max_tool_response_length": 256, "tool_response_truncate_side": "middle", "format": "hermes"}
ROLLOUT = {"prompt_length": 512, "response_length": 128, "full_determinism": False, "multi_turn": MULTI_TURN}
CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": ROLLOUT}})
#: verl's worker's dict for a greedy rollout with logprobs; a turn's budget is kept small for the 2-core CPU.
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True,
          "max_tokens": 40}


class AddTool(BaseTool):
    """A verl tool: adds its two arguments; its reward is what verl's loop records as the tool reward."""

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(int(parameters["a"]) + int(parameters["b"]))), 0.5, {}


class FirstTurnElsewhere(LLMServerClient):
    """verl's client for one trajectory whose first turn goes to ``first`` and every later one to ``rest``, each
    call passed on as verl made it (so the fake scripts the tool call and the real model answers the tool)."""

    def __init__(self, config, first: AgentloopLLMClient, rest: AgentloopLLMClient) -> None:
        super().__init__(config)
        self.first, self.rest, self.calls = first, rest, 0

    async def generate(self, request_id, **kwargs):
        self.calls += 1
        return await (self.first if self.calls == 1 else self.rest).generate(request_id, **kwargs)


def _segments(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: the model's turns in verl's response."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


async def _direct(address: str, prompt_ids: list[int], max_new_tokens: int):
    async with Router([address]) as router:
        return await router.generate(GenerateCall(
            "direct", prompt_ids, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, logprobs=True)))


async def test_verls_tool_loop_records_the_engines_turns_and_masks_the_tool_response(servers) -> None:
    embedded = servers[0]
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    seen: list[GenerateRequest] = []

    def script(request: GenerateRequest) -> list[int]:
        seen.append(request)
        return call_ids

    fake = await create_server(make_adapter("fake", {
        "script": script, "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
    }), "127.0.0.1:0")
    await start_adapter(fake)
    fake_address = f"127.0.0.1:{fake.port}"
    first, rest = AgentloopLLMClient(CONFIG, servers=[fake_address]), AgentloopLLMClient(CONFIG, servers=[embedded])
    loop = ToolAgentLoop(
        trainer_config=DictConfigWrap(CONFIG), server_manager=FirstTurnElsewhere(CONFIG, first, rest),
        tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})),
        hf_model_type="llama", tools=ToolListWrap([AddTool({}, OpenAIFunctionToolSchema.model_validate(ADD_SCHEMA))]),
    )
    try:
        output = await loop.run(dict(GREEDY), raw_prompt=[{"role": "user", "content": "What is 2 + 3?"}])
        (a, b), (c, d) = _segments(output.response_mask)
        ids, logprobs = output.response_ids, output.response_logprobs
        scripted = await _direct(fake_address, list(seen[0].prompt_ids), GREEDY["max_tokens"])
        answered = await _direct(embedded, output.prompt_ids + ids[:c], GREEDY["max_tokens"])
    finally:
        await first.close()
        await rest.close()
        await fake.stop(grace_s=1)
    assert seen[0].prompt_ids.tolist() == output.prompt_ids  # the loop's prompt reached the engine as built
    # 1. the scripted tool call, ended by the engine's eos: the engine's ids and logprobs
    assert a == 0 and ids[a:b] == [*call_ids, tokenizer.eos_token_id] == list(scripted.token_ids)
    assert logprobs[a:b] == pytest.approx(list(scripted.logprobs), abs=1e-6)
    # 2. the tool's answer, written by verl's loop: mask 0, logprob 0
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(ids[b:c])
    assert not any(logprobs[b:c]) and output.extra_fields["tool_rewards"] == [0.5]
    # 3. the real model's answer to it: the embedded engine's ids and logprobs for that very context
    assert ids[c:d] == list(answered.token_ids) and d == len(ids)
    assert logprobs[c:d] == pytest.approx(list(answered.logprobs), abs=1e-4)
    assert output.num_turns == 4  # verl counts the prompt, two assistant turns and the tool turn
