"""verl's own ``ToolAgentLoop``, unchanged, on a ToolExecute server through ``ToolExecuteTool`` (verl's tool YAML of
docs/verl.md, loaded by verl's own loader): the tools' results, rewards and per-call instances are the server's, the
response mask is 0 on exactly the tool responses, and a tool server that stops mid-trajectory stops the rollout step
(``UntrainableToolCallError``, the cause named) instead of becoming text the model is trained on. As in
test_verl_tool_loop.py, the fake engine scripts the first turn's tool calls and the embedded SmolLM2 answers them."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import pydantic
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.llm_server import LLMServerClient

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateRequest
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.verl.client import AgentloopLLMClient
from agentloop_grpc.integrations.verl.remote_tool import ToolExecuteTool, UntrainableToolCallError
from agentloop_grpc.tools.client import ToolRequestError
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.server import ToolServer, create_tool_server

from ..test_readme import ROOT, fenced_blocks
from .test_verl_tool_loop import CONFIG, GREEDY, FirstTurnElsewhere, _direct, _segments

#: The address docs/verl.md's tool YAML names; the tests put their server's in its place.
DOCS_ADDRESS = "127.0.0.1:50061"
#: The model's call (scripted): its answer, which the tool checks against the row's ground truth.
CALL = '<tool_call>\n{"name": "check_answer", "arguments": {"answer": "5"}}\n</tool_call>'


def docs_tools(address: str, tmp_path: Path) -> list:
    """docs/verl.md's tool YAML, pointed at ``address``, as verl's own loader builds it."""
    block = next(b for b in fenced_blocks(ROOT / "docs" / "verl.md")
                 if b.lang == "yaml" and "remote_tool.ToolExecuteTool" in b.body)
    assert DOCS_ADDRESS in block.body
    path = tmp_path / "tools.yaml"
    path.write_text(block.body.replace(DOCS_ADDRESS, address))
    return initialize_tools_from_config(str(path))


def tool_loop(manager: LLMServerClient, tokenizer, tools: list) -> ToolAgentLoop:
    return ToolAgentLoop(
        trainer_config=DictConfigWrap(CONFIG), server_manager=manager, tokenizer=tokenizer, processor=None,
        dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})), hf_model_type="llama",
        tools=ToolListWrap(tools),
    )


@asynccontextmanager
async def fake_engine(tokenizer, reply: str, seen: list[GenerateRequest]) -> AsyncIterator[str]:
    """A fake engine server whose every turn is ``reply`` (its requests kept in ``seen``); its address."""
    ids = tokenizer.encode(reply, add_special_tokens=False)

    def script(request: GenerateRequest) -> list[int]:
        seen.append(request)
        return ids

    server = await create_server(make_adapter("fake", {
        "script": script, "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
    }), "127.0.0.1:0")
    await start_adapter(server)
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(grace_s=1)


@asynccontextmanager
async def tool_server(*functions: str) -> AsyncIterator[ToolServer]:
    server = await create_tool_server(ToolServerConfig.model_validate({"tools": [{"function": f} for f in functions]}),
                                      "127.0.0.1:0")
    try:
        yield server
    finally:
        await server.stop(grace_s=1)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(model_store.prepare()))


async def test_verls_tool_loop_runs_the_servers_tools_with_an_instance_per_call(servers, tokenizer,
                                                                                tmp_path) -> None:
    embedded, tool_address, _, tool_server_ = servers
    live = tool_server_.instances.live_instances  # the shared server's, whatever other modules left to its TTL
    tools = await asyncio.to_thread(docs_tools, tool_address, tmp_path)
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    seen: list = []
    async with fake_engine(tokenizer, CALL, seen) as fake_address:
        first, rest = AgentloopLLMClient(CONFIG, servers=[fake_address]), AgentloopLLMClient(CONFIG, servers=[embedded])
        loop = tool_loop(FirstTurnElsewhere(CONFIG, first, rest), tokenizer, tools)
        try:
            output = await loop.run(dict(GREEDY), raw_prompt=[{"role": "user", "content": "What is 2 + 3?"}],
                                    tools_kwargs={"check_answer": {"create_kwargs": {"ground_truth": "5"}}})
            (a, b), (c, d) = _segments(output.response_mask)
            ids, logprobs = output.response_ids, output.response_logprobs
            scripted = await _direct(fake_address, list(seen[0].prompt_ids), GREEDY["max_tokens"])
            answered = await _direct(embedded, output.prompt_ids + ids[:c], GREEDY["max_tokens"])
        finally:
            await first.close()
            await rest.close()
            for tool in tools:
                await tool.close()
    assert [tool.name for tool in tools] == ["calculator", "check_answer"]
    # 1. the scripted call: the engine's ids and logprobs
    assert a == 0 and ids[a:b] == [*call_ids, tokenizer.eos_token_id] == list(scripted.token_ids)
    assert logprobs[a:b] == pytest.approx(list(scripted.logprobs), abs=1e-6)
    # 2. the server's answer, mask 0: check_answer's verdict on the row's ground truth (its create_kwargs), its reward
    assert "<tool_response>\nCorrect.\n</tool_response>" in tokenizer.decode(ids[b:c])
    assert not any(logprobs[b:c]) and output.extra_fields["tool_rewards"] == [1.0]
    # 3. the embedded model's answer to it
    assert ids[c:d] == list(answered.token_ids) and d == len(ids)
    assert logprobs[c:d] == pytest.approx(list(answered.logprobs), abs=1e-4)
    # every instance the loop created was released, on the server too
    assert [tool.live_instances for tool in tools] == [0, 0] and tool_server_.instances.live_instances == live


class StopsTheToolServer(LLMServerClient):
    """verl's client of one trajectory whose first turn is the fake engine's, after which the tool server stops."""

    def __init__(self, config, engine: AgentloopLLMClient, tool_server: ToolServer) -> None:
        super().__init__(config)
        self.engine, self.tool_server, self.calls = engine, tool_server, 0

    async def generate(self, request_id, **kwargs):
        self.calls += 1
        output = await self.engine.generate(request_id, **kwargs)
        await self.tool_server.stop(grace_s=0)
        return output


async def test_a_tool_server_stopped_mid_trajectory_stops_the_step_instead_of_teaching_the_model(tokenizer) -> None:
    call = '<tool_call>\n{"name": "measure", "arguments": {"text": "abc"}}\n</tool_call>'
    async with tool_server("tests.tools.state_tool:measure") as server, \
            fake_engine(tokenizer, call, []) as fake_address:
        config = {"type": "native", "address": f"127.0.0.1:{server.port}", "tool_name": "measure", "timeout_s": 10}
        tool = await asyncio.to_thread(ToolExecuteTool, config, None)
        engine = AgentloopLLMClient(CONFIG, servers=[fake_address])
        manager = StopsTheToolServer(CONFIG, engine, server)
        try:
            with pytest.raises(UntrainableToolCallError) as raised:
                await tool_loop(manager, tokenizer, [tool]).run(
                    dict(GREEDY), raw_prompt=[{"role": "user", "content": "How long is abc?"}])
        finally:
            await engine.close()
            await tool.close()
    failure = raised.value
    assert (failure.tool_name, failure.cause) == ("measure", "tool_server_unavailable")
    assert "CreateInstance: UNAVAILABLE" in failure.detail
    assert manager.calls == 1 and tool.live_instances == 0  # no turn after it: the model read no error text
    carried = pickle.loads(pickle.dumps(failure))  # as Ray carries it from the worker to the trainer
    assert (carried.tool_name, carried.cause, str(carried)) == (failure.tool_name, failure.cause, str(failure))


async def test_the_tool_forwards_rewards_tool_errors_images_and_the_loops_state(servers) -> None:
    _, tool_address, _, builtin = servers
    live = builtin.instances.live_instances  # the shared server's, whatever other modules left to its TTL
    check = await asyncio.to_thread(ToolExecuteTool, {"address": tool_address, "tool_name": "check_answer"}, None)
    async with tool_server("tests.tools.image_tool:draw", "tests.tools.image_tool:plot",
                           "tests.tools.state_tool:whoami") as server:
        address = f"127.0.0.1:{server.port}"
        draw, plot, whoami = [await asyncio.to_thread(ToolExecuteTool, {"address": address, "tool_name": name}, None)
                              for name in ("draw", "plot", "whoami")]
        try:
            # calc_reward -> CalcReward, on the instance create_kwargs made; a bad argument is the model's to read
            instance, _ = await check.create(create_kwargs={"ground_truth": "7"})
            wrong, wrong_reward, _ = await check.execute(instance, {"answer": "seven"})
            right, right_reward, _ = await check.execute(instance, {"answer": "7"})
            reward = await check.calc_reward(instance)
            assert builtin.instances.live_instances == live + 1  # one server instance for the verl instance's calls
            await check.release(instance)
            # a picture decoded for verl's processor; one that does not decode is the tool's error
            instance, _ = await draw.create()
            drawn, _, _ = await draw.execute(instance, {"colour": "red"})
            await draw.release(instance)
            instance, _ = await plot.create()
            broken, _, _ = await plot.execute(instance, {"title": "t"})
            await plot.release(instance)
            # the loop's state, from verl's agent_data
            agent_data = AgentData(messages=[{"role": "user", "content": "who calls?"},
                                             {"role": "assistant", "content": "", "tool_calls": []}],
                                   image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
                                   metrics={}, request_id="req-9", tools_kwargs={})
            agent_data.assistant_turns = 1
            instance, _ = await whoami.create()
            answer, _, metrics = await whoami.execute(instance, {"question": "?"}, agent_data=agent_data)
            await whoami.release(instance)
        finally:
            for tool in (check, draw, plot, whoami):
                await tool.close()
        assert server.instances.live_instances == 0
    assert wrong.text.startswith("Error (invalid_arguments): ") and wrong_reward == 0.0
    assert (right.text, right_reward, reward) == ("Correct.", 1.0, 1.0)
    assert builtin.instances.live_instances == live
    assert drawn.text == "a red square" and drawn.image[0].getpixel((0, 0)) == (255, 0, 0)
    assert broken.text.startswith("Error (invalid image): ") and broken.image is None
    assert answer.text == "req-9 turn 0 after 2 messages; asked: who calls?" and metrics["messages"] == 2.0


def test_the_servers_schema_is_the_truth_and_bad_configs_are_refused_by_name(servers, tmp_path) -> None:
    _, tool_address, _, _ = servers
    calculator, check_answer = docs_tools(tool_address, tmp_path)
    served = calculator.tool_schema.function
    assert served.parameters.properties["expression"].type == "string" and "exactly" in served.description
    schema = check_answer.tool_schema.model_dump()
    schema["function"]["description"] = "Check an answer."
    with pytest.raises(ValueError, match=r"function\.description: 'Check an answer\.' in the YAML, 'Submit"):
        ToolExecuteTool({"address": tool_address}, OpenAIFunctionToolSchema.model_validate(schema))
    with pytest.raises(ValueError, match=r"hosts no tool 'search'; it hosts \['calculator', 'check_answer', "):
        ToolExecuteTool({"address": tool_address, "tool_name": "search"}, None)
    with pytest.raises(ValueError, match=r"give config\.tool_name"):
        ToolExecuteTool({"address": tool_address}, None)
    with pytest.raises(pydantic.ValidationError, match="timeout"):
        ToolExecuteTool({"address": tool_address, "tool_name": "calculator", "timeout": 5}, None)


def test_a_tool_server_that_does_not_answer_at_start_is_named() -> None:
    with pytest.raises(ConnectionError, match=r"the tool server at 127\.0\.0\.1:1 did not list its tools"):
        ToolExecuteTool({"address": "127.0.0.1:1", "tool_name": "calculator", "timeout_s": 5}, None)


async def test_creation_arguments_a_tool_refuses_stop_the_step_too(servers) -> None:
    _, tool_address, _, builtin = servers
    live = builtin.instances.live_instances
    check = await asyncio.to_thread(ToolExecuteTool, {"address": tool_address, "tool_name": "check_answer"}, None)
    try:
        instance, _ = await check.create(create_kwargs={})  # the row lost its ground truth: a data bug
        with pytest.raises(ToolRequestError, match="ground_truth"):
            await check.execute(instance, {"answer": "5"})
        with pytest.raises(UntrainableToolCallError) as raised:
            await check.release(instance)
    finally:
        await check.close()
    assert raised.value.cause == "tool_request_refused" and "ground_truth" in raised.value.detail
    assert check.live_instances == 0 and builtin.instances.live_instances == live
