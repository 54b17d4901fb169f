"""verl's own single-turn agent loop, unchanged, on our engines through ``AgentloopLLMClient`` (verl 0.9.1 running
for real): the ids and logprobs it records are the engine's, and verl's sampling dict reaches the engine as
mapped, checked on the engine side; an engine paused with abort answers verl 'aborted' with the tokens so far,
and verl's fully-async client resumes from them."""

from __future__ import annotations

import asyncio
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.utils.dataset.rl_dataset import RLHFDataset

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateRequest, PauseMode, SamplingParams
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.background_loop import BackgroundLoop
from agentloop_grpc.integrations.verl import sampling_from_verl
from agentloop_grpc.integrations.verl.client import AgentloopFullyAsyncLLMClient, AgentloopLLMClient
from agentloop_grpc.router import Fleet, GenerateCall, NoHealthyServerError, Router, RouterConfig

CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 24}}})
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def _loop(client: AgentloopLLMClient) -> SingleTurnAgentLoop:
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    return SingleTurnAgentLoop(
        trainer_config=DictConfigWrap(CONFIG), server_manager=client, tokenizer=tokenizer, processor=None,
        dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})), hf_model_type="llama",
    )


async def test_verls_single_turn_loop_records_the_engines_ids_and_logprobs(servers) -> None:
    address = servers[0]  # the embedded engine
    client = AgentloopLLMClient(CONFIG, servers=[address])
    try:
        output = await _loop(client).run(dict(GREEDY), raw_prompt=MESSAGES)
        async with Router([address]) as router:  # the same prompt straight to the engine
            direct = await router.generate(GenerateCall(
                "direct", output.prompt_ids, SamplingParams(max_new_tokens=24, temperature=0.0, logprobs=True)
            ))
    finally:
        await client.close()
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
    assert first.priority == -3 and first.session_id == "traj-7" and seen[1].session_id == "traj-7"
    assert seen[1].sampling.max_new_tokens == 24 and not seen[1].sampling.logprobs  # verl's default: response_length
    assert output.token_ids[:3] == [5, 6, 7] and len(output.log_probs) == len(output.token_ids)
    assert output.stop_reason == "completed" and again.log_probs is None
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 0
    assert output.extra_fields["num_cached_tokens"] == 0 and set(output.extra_fields) == {
        "global_steps", "min_global_steps", "max_global_steps", "num_cached_tokens"}


@pytest.mark.parametrize(("params", "needle"), [
    ({"stop": ["\n"]}, "'stop'"), ({"n": 2}, "'n'"), ({"best_of": 2}, "best_of"),
])
def test_a_verl_key_without_an_equivalent_is_refused_by_name(params, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        sampling_from_verl(params, 16)


async def _fake_server(**config):
    server = await create_server(make_adapter("fake", {"vocab_size": 50_000, **config}), "127.0.0.1:0")
    await start_adapter(server)
    return server, f"127.0.0.1:{server.port}"


async def test_the_rollout_configs_defaults_reach_the_engine_as_verls_servers_apply_them() -> None:
    seen: list[GenerateRequest] = []

    def script(request: GenerateRequest) -> list[int]:
        seen.append(request)
        return [5]

    server, address = await _fake_server(script=script)
    rollout = {"prompt_length": 256, "response_length": 24, "repetition_penalty": 1.3, "ignore_eos": True,
               "full_determinism": True, "seed": 7}
    client = AgentloopLLMClient(OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}}), servers=[address])
    try:
        await client.generate("r", prompt_ids=[1, 2], sampling_params={"temperature": 1.0, "max_tokens": 2})
        await client.generate("r", prompt_ids=[1, 2], sampling_params={"repetition_penalty": 1.0, "seed": 3,
                                                                       "ignore_eos": False, "max_tokens": 2})
    finally:
        await client.close()
        await server.stop(grace_s=1)
    assert seen[0].sampling.repetition_penalty == pytest.approx(1.3) and seen[0].sampling.ignore_eos
    assert seen[0].sampling.seed == 7  # one seed for every server: a session may be placed on any
    assert seen[1].sampling.repetition_penalty == 1.0 and not seen[1].sampling.ignore_eos  # the dict wins
    assert seen[1].sampling.seed == 3


async def test_concurrent_first_calls_share_one_router_and_a_used_client_still_pickles() -> None:
    server, address = await _fake_server()
    client = AgentloopLLMClient(CONFIG, servers=[address])
    try:
        routers = await asyncio.gather(*(client.router() for _ in range(4)))  # verl starts its loops together
        assert all(router is routers[0] for router in routers)
        copy = pickle.loads(pickle.dumps(client))  # verl hands its client to Ray workers
        output = await copy.generate("r", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 3})
        assert len(output.token_ids) == 3 and await copy.router() is not routers[0]
        await copy.close()
    finally:
        await client.close()
        await server.stop(grace_s=1)


def _positions(request):
    """The fake's reply: each token names its absolute position, so a resumed generation continues the series."""
    return [1000 + len(request.prompt_ids) + i for i in range(200)]


async def _paused_midway(client_cls, sampling_params: dict, paused_s: float):
    """verl's output of a generation through ``client_cls`` during which the engine is paused with abort (for
    ``paused_s``, then resumed)."""
    server, address = await _fake_server(script=_positions, token_latency_s=0.01)
    client = client_cls(CONFIG, servers=[address])
    try:
        async with Fleet([address]) as fleet:
            task = asyncio.create_task(client.generate("t", prompt_ids=[1, 2, 3], sampling_params=sampling_params))
            await asyncio.sleep(0.1)  # some tokens out, most of the budget left
            (await fleet.pause(PauseMode.ABORT)).raise_for_errors()
            await asyncio.sleep(paused_s)
            await fleet.resume()
            return await task
    finally:
        await client.close()
        await server.stop(grace_s=1)


async def test_a_generation_aborted_by_pause_answers_aborted_with_the_tokens_so_far() -> None:
    output = await _paused_midway(AgentloopLLMClient, {"temperature": 0.0, "logprobs": True, "max_tokens": 100}, 0)
    assert output.stop_reason == "aborted"
    assert 0 < len(output.token_ids) < 100 and output.token_ids == [1003 + i for i in range(len(output.token_ids))]
    assert len(output.log_probs) == len(output.token_ids)


async def test_verls_fully_async_client_resumes_an_aborted_generation_after_resume() -> None:
    # verl retries an aborted call after a pause of its own; the retry waits on the paused engine for Resume
    output = await _paused_midway(AgentloopFullyAsyncLLMClient, {"temperature": 0.0, "logprobs": True}, 0.2)
    budget = CONFIG.actor_rollout_ref.rollout.response_length
    assert output.token_ids == [1003 + i for i in range(budget)]  # one uninterrupted series across the abort
    assert len(output.log_probs) == budget and output.stop_reason == "length"  # verl's name for a spent budget


async def test_a_budget_past_the_engines_context_is_clamped_as_verls_servers_do() -> None:
    server, address = await _fake_server(max_model_len=64)
    client = AgentloopLLMClient(CONFIG, servers=[address])
    try:
        # verl's own servers cut an explicit max_tokens to the room the context leaves, and raise a spent one to 1
        long = await client.generate("r", prompt_ids=list(range(3, 53)), sampling_params={"max_tokens": 40,
                                                                                           "ignore_eos": True})
        spent = await client.generate("r", prompt_ids=[3, 4], sampling_params={"max_tokens": 0, "ignore_eos": True})
    finally:
        await client.close()
        await server.stop(grace_s=1)
    assert len(long.token_ids) == 64 - 50 and long.stop_reason == "completed"
    assert len(spent.token_ids) == 1


def test_a_client_used_from_a_second_event_loop_says_to_close_it_first() -> None:
    loop = BackgroundLoop("verl-client-engine")  # the engine serves on, whichever loop the client is called from
    server = loop.run(_fake_server())[0]
    client = AgentloopLLMClient(CONFIG, servers=[f"127.0.0.1:{server.port}"])

    async def generate(close: bool):
        try:
            return await client.generate("r", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 2})
        finally:
            if close:
                await client.close()

    try:
        assert len(asyncio.run(generate(close=True)).token_ids) == 2  # one event loop per call, as verl's
        assert len(asyncio.run(generate(close=False)).token_ids) == 2  # auto_await does from sync code
        with pytest.raises(RuntimeError, match=r"another event loop: await client.close"):
            asyncio.run(generate(close=False))
    finally:
        loop.run(server.stop(grace_s=1))
        loop.close()


async def test_verls_priorities_keep_their_order_lower_first_as_in_vllm() -> None:
    server, address = await _fake_server(max_running=1, token_latency_s=0.01)
    client = AgentloopLLMClient(CONFIG, servers=[address])
    finished = []

    async def generate(priority: int, tokens: int) -> None:
        await client.generate(f"s{priority}", prompt_ids=[1, 2, 3], priority=priority,
                              sampling_params={"max_tokens": tokens, "ignore_eos": True})
        finished.append(priority)

    try:
        await generate(9, 1)  # the Router is open
        busy = asyncio.create_task(generate(5, 10))  # holds the engine's one slot while the others queue
        await asyncio.sleep(0.03)
        await asyncio.gather(*(generate(priority, 1) for priority in (3, 1, 2)))  # verl's: sample indices
        await busy
    finally:
        await client.close()
        await server.stop(grace_s=1)
    assert finished == [9, 5, 1, 2, 3]


async def test_a_client_whose_servers_never_come_up_says_so_and_tries_afresh_next_time() -> None:
    client = AgentloopLLMClient(CONFIG, servers=["127.0.0.1:1"], router_config=RouterConfig(no_server_wait_s=0.2))
    for _ in range(2):
        with pytest.raises(NoHealthyServerError, match="healthy"):
            await client.generate("r", prompt_ids=[1], sampling_params={})
    assert client._router is None


async def test_a_generation_whose_server_is_killed_resumes_on_another_and_verl_sees_one_output() -> None:
    # the victim in its own process, so it can die without a word; the survivor, the same fake engine, here
    victim = subprocess.Popen([str(Path(sys.executable).parent / "agentloop"), "engine", "serve", "--adapter", "fake",
                               "--port", "0", "--set", "token_latency_s=0.01", "--log-level", "WARNING"],
                              stdout=subprocess.PIPE, text=True)
    survivor, survivor_address = await _fake_server(vocab_size=FakeEngineConfig().vocab_size, token_latency_s=0.01)
    client = AgentloopLLMClient(CONFIG, servers=[victim.stdout.readline().split()[4]])  # "... listening on ADDR"
    budget = 160  # the Router's generate receives tokens in groups of 32: some must have arrived at the kill
    greedy = {"temperature": 0.0, "logprobs": True, "ignore_eos": True, "max_tokens": budget}
    try:
        router = await client.router()
        task = asyncio.create_task(client.generate("t", prompt_ids=[1, 2, 3], sampling_params=greedy))
        await asyncio.sleep(0.8)  # the victim's tokens flow
        await router.fleet.add_server(survivor_address)
        victim.send_signal(signal.SIGKILL)
        output = await task
        async with Router([survivor_address]) as direct:  # what the survivor makes of the prompt and of the rest
            whole = await direct.generate(GenerateCall("d", [1, 2, 3], sampling_from_verl(greedy, 0)))
            split = next(i for i, (a, b) in enumerate(zip(output.token_ids, whole.token_ids)) if a != b)
            rest = await direct.generate(GenerateCall("d", [1, 2, 3, *output.token_ids[:split]],
                                                      sampling_from_verl({**greedy, "max_tokens": budget - split}, 0)))
    finally:
        victim.kill()
        victim.wait()
        await client.close()
        await survivor.stop(grace_s=0)
    assert 0 < split < budget and output.token_ids[split:] == list(rest.token_ids)  # nothing lost, nothing twice
    assert len(output.log_probs) == budget and output.num_preempted == 1 and output.stop_reason == "completed"
