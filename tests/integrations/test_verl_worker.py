"""verl's own ``AgentLoopWorker`` and ``AgentLoopManager`` machinery on our engines (verl 0.9.1 running for real):
the DataProto verl's ``_postprocess`` builds comes from verl's loops over ``AgentloopLLMClient``, its masks cover
exactly the model's tokens, verl's GRPO advantage and vanilla policy loss run on it; and
``RouterAgentLoopManager``, loaded by name from verl's config as verl's trainer loads it, hands its Ray workers
our client."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import torch
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn
from verl.utils.import_utils import load_class_from_fqn
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.router import get_router_handle

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateRequest
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.background_loop import BackgroundLoop
from agentloop_grpc.integrations.verl.client import AgentloopFullyAsyncLLMClient, AgentloopLLMClient
from agentloop_grpc.integrations.verl.loops_manager import (
    RouterAgentLoopManager,
    RouterAgentLoopWorker,
    agentloop_client,
)

from .test_verl_tool_loop import ADD_SCHEMA, CALL, MULTI_TURN, ROLLOUT, AddTool, _direct, _segments

MANAGER = "agentloop_grpc.integrations.verl.loops_manager.RouterAgentLoopManager"
ANSWER = "The answer is 5."
QUESTIONS = ("What is 2 + 3?", "Add 2 and 3.")


def verl_config(response_length: int, *, tool_config_path: str | None = None, servers: tuple[str, ...] = ()):
    """The least of verl's trainer config that its worker and manager read: the model (tokenizer, HF config), the
    rollout (each section a verl dataclass by ``_target_`` for the worker, every key the loops read from the raw
    config set), data and distillation (off); greedy with logprobs."""
    rollout = {
        **ROLLOUT, "_target_": "verl.workers.config.RolloutConfig", "name": "agentloop",
        "response_length": response_length, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
        "calculate_log_probs": True,
        "multi_turn": {**MULTI_TURN, "_target_": "verl.workers.config.MultiTurnConfig",
                       "tool_config_path": tool_config_path},
        "agent": {"_target_": "verl.workers.config.AgentLoopConfig", "num_workers": 1,
                  "default_agent_loop": "single_turn_agent", "agent_loop_manager_class": MANAGER},
        "trace": {"_target_": "verl.workers.config.TraceConfig"},
        "custom": {"agentloop": {"servers": list(servers)}},
    }
    model = {"_target_": "verl.workers.config.HFModelConfig", "path": str(model_store.prepare())}
    return OmegaConf.create({"actor_rollout_ref": {"model": model, "rollout": rollout}, "data": {},
                             "distillation": {"enabled": False}})


def prompts(groups: int, per_group: int, agent_name: str) -> DataProto:
    """verl's rollout input: ``per_group`` samples of each of ``groups`` questions, a uid per question."""
    rows = [(g, [{"role": "user", "content": QUESTIONS[g]}]) for g in range(groups) for _ in range(per_group)]
    raw = np.empty(len(rows), dtype=object)
    raw[:] = [messages for _, messages in rows]
    return DataProto.from_dict(non_tensors={
        "raw_prompt": raw, "agent_name": np.array([agent_name] * len(rows), dtype=object),
        "uid": np.array([f"q{g}" for g, _ in rows], dtype=object), "index": np.array([g for g, _ in rows]),
    })


def _unpadded(data: DataProto, i: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """Row ``i``'s prompt, response, response mask and logprobs without verl's padding."""
    p = data.batch["prompts"].size(1)
    attention = data.batch["attention_mask"][i]
    prompt = data.batch["prompts"][i][attention[:p] == 1].tolist()
    n = int(attention[p:].sum())
    return (prompt, data.batch["responses"][i, :n].tolist(), data.batch["response_mask"][i, :n].tolist(),
            data.batch["rollout_log_probs"][i, :n].tolist())


async def _started(adapter):
    server = await create_server(adapter, "127.0.0.1:0")
    await start_adapter(server)
    return server


async def _scripted_fake(tokenizer, log: list[tuple[str, str]] | None = None, name: str = ""):
    """A fake engine that answers a prompt without a tool response with the tool call, else with ANSWER; it logs
    (``name``, session) of each request in ``log``."""
    call, answer = (tokenizer.encode(text, add_special_tokens=False) for text in (CALL, ANSWER))

    def script(request):
        if log is not None:
            log.append((name, request.session_id))
        return answer if "<tool_response>" in tokenizer.decode(request.prompt_ids.tolist()) else call

    server = await _started(make_adapter("fake", {
        "script": script, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
    }))
    return server, f"127.0.0.1:{server.port}", call, answer


def _tool_config(tmp_path) -> str:
    """verl's tool config file: the worker loads AddTool by its class name."""
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [{"class_name": f"{AddTool.__module__}.AddTool",
                                               "config": {"type": "native"}, "tool_schema": ADD_SCHEMA}]}))
    return str(path)


async def test_verls_worker_builds_its_batch_from_its_tool_loops_on_our_engine_and_grpo_runs_on_it(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    server, address, call, answer = await _scripted_fake(tokenizer)
    config = verl_config(128, tool_config_path=_tool_config(tmp_path))
    client = AgentloopLLMClient(config, servers=[address])
    try:
        data = await AgentLoopWorker(config, client).generate_sequences(prompts(2, 2, "tool_agent"))
        rows = [_unpadded(data, i) for i in range(len(data))]
        # each model turn again, straight to the engine: the first from the prompt, the second from its context
        turns = [(await _direct(address, prompt, 64), await _direct(address, prompt + response[:c], 64))
                 for prompt, response, mask, _ in rows for c, _ in _segments(mask)[1:]]
    finally:
        await client.close()
        await server.stop(grace_s=1)
    eos = tokenizer.eos_token_id
    for (_prompt, response, mask, logprobs), (first, second) in zip(rows, turns, strict=True):
        (a, b), (c, d) = _segments(mask)
        assert response[a:b] == [*call, eos] == list(first.token_ids) and a == 0  # the engine's ids, as sent
        assert response[c:d] == [*answer, eos] == list(second.token_ids) and d == len(response)
        assert logprobs[a:b] == pytest.approx(list(first.logprobs), abs=1e-6)
        assert logprobs[c:d] == pytest.approx(list(second.logprobs), abs=1e-6)
        assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(response[b:c]) and not any(logprobs[b:c])
    assert list(data.non_tensor_batch["__num_turns__"]) == [4] * len(data)
    assert list(data.non_tensor_batch["tool_rewards"]) == [[0.5]] * len(data)
    assert set(data.non_tensor_batch["max_global_steps"]) == {0}
    # verl's GRPO and PPO loss on the batch; rewards are inputs here (one right, one wrong answer per question)
    mask = data.batch["response_mask"]
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    last = data.batch["attention_mask"][:, data.batch["prompts"].size(1):].sum(dim=1) - 1
    rewards[torch.arange(len(data)), last] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=data.non_tensor_batch["uid"])
    assert not advantages[mask == 0].any() and advantages[0][mask[0] == 1].unique().item() > 0
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                              "loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"},
                              "global_batch_info": {"dp_size": 1, "batch_num_tokens": int(mask.sum()),
                                                    "global_batch_size": len(data)}})
    old = data.batch["rollout_log_probs"]
    loss, _ = get_policy_loss_fn("vanilla")(old_log_prob=old, log_prob=old + 0.01 * mask, advantages=advantages,
                                            response_mask=mask, loss_agg_mode="token-mean", config=actor)
    assert torch.isfinite(loss)


async def test_each_trajectory_of_verls_worker_sticks_to_one_of_our_servers(tmp_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    log: list[tuple[str, str]] = []
    fakes = [await _scripted_fake(tokenizer, log, name) for name in ("a", "b")]
    config = verl_config(128, tool_config_path=_tool_config(tmp_path))
    client = AgentloopLLMClient(config, servers=[address for _, address, *_ in fakes])
    try:
        await AgentLoopWorker(config, client).generate_sequences(prompts(2, 2, "tool_agent"))
    finally:
        await client.close()
        for server, *_ in fakes:
            await server.stop(grace_s=1)
    placed: dict[str, set[str]] = {}
    for name, session in log:  # verl's request id per trajectory is the Router's session
        placed.setdefault(session, set()).add(name)
    assert len(log) == 8 and len(placed) == 4
    assert all(len(servers) == 1 for servers in placed.values())  # both turns on one server: its prefix cache
    assert {name for name, _ in log} == {"a", "b"}  # the trajectories spread over both


async def test_our_worker_gives_the_router_each_samples_uid_as_its_grpo_group(tmp_path) -> None:
    """verl's loops never pass the sample's uid to generate(); our worker (RouterAgentLoopManager's) sets it for the
    sample's task, so the Router places a group's samples together: the prompt is prefilled once per server."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_store.prepare()))
    log: list[tuple[str, str]] = []
    fakes = [await _scripted_fake(tokenizer, log, name) for name in ("a", "b")]
    config = verl_config(128, tool_config_path=_tool_config(tmp_path))
    client = AgentloopLLMClient(config, servers=[address for _, address, *_ in fakes])
    try:
        await RouterAgentLoopWorker(config, client).generate_sequences(prompts(2, 4, "tool_agent"))
        router = await client.router()
        groups = router.live_groups  # sessions stay (verl closes none): the groups they were placed in
    finally:
        await client.close()
        for server, *_ in fakes:
            await server.stop(grace_s=1)
    assert groups == 2  # q0 and q1; none without the uid (every sample a group of its own)
    assert len(log) == 16  # 8 samples of 2 turns


async def test_verls_worker_records_the_real_models_tokens_from_the_embedded_engine(servers) -> None:
    embedded = servers[0]
    config = verl_config(8)
    client = AgentloopLLMClient(config, servers=[embedded])
    try:
        data = await AgentLoopWorker(config, client).generate_sequences(prompts(2, 1, "single_turn_agent"))
        rows = [_unpadded(data, i) for i in range(len(data))]
        direct = [await _direct(embedded, prompt, 8) for prompt, *_ in rows]
    finally:
        await client.close()
    p = data.batch["prompts"].size(1)
    assert torch.equal(data.batch["response_mask"], data.batch["attention_mask"][:, p:])  # all the model's
    for (_, response, _, logprobs), result in zip(rows, direct, strict=True):
        assert response == list(result.token_ids) and 0 < len(response) <= 8
        assert logprobs == pytest.approx(list(result.logprobs), abs=1e-4)


def test_verls_trainer_loads_our_manager_by_name_and_its_ray_workers_use_our_router() -> None:
    ray = pytest.importorskip("ray")
    seen: list[str] = []

    def script(request: GenerateRequest) -> list[int]:
        seen.append(request.session_id)
        return [5, 6, 7]

    loop = BackgroundLoop("verl-manager-engine")  # the engine serves while verl's manager blocks this thread
    server = loop.run(_started(make_adapter("fake", {
        "script": script, "vocab_size": 50_000,
    })))
    config = verl_config(8)  # no servers of ours: they come from verl's balancer, as in a run with name=agentloop
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    try:
        manager_class = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                            "AgentLoopManager")  # as verl's trainer does
        assert issubclass(manager_class, RouterAgentLoopManager)
        # verl's own client and balancer, whose server ids are our servers' addresses (our replica registers them)
        balancer = get_router_handle(servers={f"127.0.0.1:{server.port}": None})
        manager = manager_class.create(config=config, llm_client=LLMServerClient(config, balancer))
        data = manager.generate_sequences(prompts(2, 1, "single_turn_agent"))
        for worker in manager.agent_loop_workers:  # a Ray shared with later suites keeps no idle process of ours
            ray.kill(worker)
    finally:
        if started:
            ray.shutdown()
        loop.run(server.stop(grace_s=1))
        loop.close()
    assert isinstance(manager.llm_client, AgentloopLLMClient)
    assert len(seen) == 2 and len(set(seen)) == 2  # one session per trajectory: verl's request ids
    assert data.batch["responses"][:, :4].tolist() == [[5, 6, 7, 2]] * 2  # the engine's ids, its eos ending them
    assert data.batch["response_mask"].sum().item() == 8


async def test_a_fully_async_client_of_verls_becomes_ours_with_its_resume_semantics() -> None:
    config = verl_config(8, servers=("127.0.0.1:1",))
    ours = await agentloop_client(config, FullyAsyncLLMServerClient(config, only_hybrid=True))
    assert isinstance(ours, AgentloopFullyAsyncLLMClient) and ours._only_hybrid
    assert await agentloop_client(config, ours) is ours
    with pytest.raises(ValueError, match=r"custom.agentloop.servers"):  # neither our servers nor verl's balancer
        await agentloop_client(verl_config(8), LLMServerClient(config))
