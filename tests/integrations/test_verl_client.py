"""verl's own single-turn agent loop, unchanged, on our engines through ``AgentloopLLMClient`` (verl 0.9.1 running
for real): the ids and logprobs it records are the engine's, and verl's sampling dict reaches the engine as
mapped, checked on the engine side."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from agentloop_grpc.common import model_store  # noqa: E402
from agentloop_grpc.common.types import SamplingParams  # noqa: E402
from agentloop_grpc.engine_adapters.factory import make_adapter  # noqa: E402
from agentloop_grpc.engine_adapters.server import create_server, start_adapter  # noqa: E402
from agentloop_grpc.integrations.verl import sampling_from_verl  # noqa: E402
from agentloop_grpc.integrations.verl.client import AgentloopLLMClient  # noqa: E402
from agentloop_grpc.router import GenerateCall, Router  # noqa: E402

CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 24}}})
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def _loop(client: AgentloopLLMClient) -> SingleTurnAgentLoop:
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    return SingleTurnAgentLoop(
        trainer_config=DictConfigWrap(CONFIG), server_manager=client, tokenizer=tokenizer, processor=None,
        dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})), hf_model_type="llama",
    )


async def test_verls_single_turn_loop_records_the_engines_ids_and_logprobs() -> None:
    server = await create_server(make_adapter("embedded", {"max_running": 4, "max_model_len": 1024}), "127.0.0.1:0")
    await start_adapter(server)
    address = f"127.0.0.1:{server.port}"
    client = AgentloopLLMClient(CONFIG, servers=[address])
    try:
        output = await _loop(client).run(dict(GREEDY), raw_prompt=MESSAGES)
        async with Router([address]) as router:  # the same prompt straight to the engine
            direct = await router.generate(GenerateCall(
                "direct", output.prompt_ids, SamplingParams(max_new_tokens=24, temperature=0.0, logprobs=True)
            ))
    finally:
        await client.close()
        await server.stop(grace_s=1)
    assert output.response_ids == list(direct.token_ids) and output.response_ids
    assert output.response_mask == [1] * len(output.response_ids)  # every response token is the model's
    assert output.response_logprobs == pytest.approx(list(direct.logprobs), abs=1e-5)
    assert output.num_turns == 2


async def test_verls_sampling_dict_and_request_id_reach_the_engine_as_mapped() -> None:
    seen = []

    def script(request):  # the fake engine's reply; it records what reached it
        seen.append(request)
        return [5, 6, 7]

    server = await create_server(make_adapter("fake", {"script": script, "vocab_size": 50_000}), "127.0.0.1:0")
    await start_adapter(server)
    client = AgentloopLLMClient(CONFIG, servers=[f"127.0.0.1:{server.port}"])
    try:
        output = await client.generate(
            "traj-7", prompt_ids=[1, 2, 3], priority=3,
            sampling_params={"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.1,
                             "presence_penalty": 0.2, "frequency_penalty": 0.1, "seed": 11, "logprobs": 2,
                             "stop_token_ids": [9], "ignore_eos": False, "max_tokens": 8, "n": 1,
                             "skip_special_tokens": True},
        )
        again = await client.generate("traj-7", prompt_ids=[1, 2, 3, 5, 6, 7], sampling_params={"logprobs": False})
    finally:
        await client.close()
        await server.stop(grace_s=1)
    first = seen[0]
    expected = SamplingParams(
        max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=-1, min_p=0.05, repetition_penalty=1.1,
        presence_penalty=0.2, frequency_penalty=0.1, seed=11, stop_token_ids=(9,), logprobs=True, top_logprobs=2,
    )
    for name in SamplingParams.__dataclass_fields__:  # floats crossed the wire as float32
        assert getattr(first.sampling, name) == pytest.approx(getattr(expected, name), rel=1e-6), name
    assert first.priority == 3 and first.session_id == "traj-7" and seen[1].session_id == "traj-7"
    assert seen[1].sampling.max_new_tokens == 24 and not seen[1].sampling.logprobs  # verl's default: response_length
    assert output.token_ids[:3] == [5, 6, 7] and len(output.log_probs) == len(output.token_ids)
    assert output.stop_reason == "completed" and again.log_probs is None
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 0


@pytest.mark.parametrize(("params", "needle"), [
    ({"stop": ["\n"]}, "'stop'"), ({"n": 2}, "'n'"), ({"best_of": 2}, "best_of"),
])
def test_a_verl_key_without_an_equivalent_is_refused_by_name(params, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        sampling_from_verl(params, 16)


def test_multimodal_inputs_are_refused_by_name() -> None:
    client = AgentloopLLMClient(CONFIG, servers=["127.0.0.1:1"])
    with pytest.raises(ValueError, match="image_data"):
        asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={}, image_data=["x"]))
