"""Routing replay (R3) on the tiny Qwen3-MoE: the embedded engine samples with routing, and the trainer's recompute
of the engine's logprobs, with and without replaying the engine's experts, when the trainer's router differs a
little from the engine's (as kernels and weight pushes make it differ in real training).

The engine is the real embedded engine (in process: no gRPC here, the contract's routing is tested in
tests/embedded/test_moe_routing.py); the trainer is transformers' Qwen3MoeForCausalLM on the same checkpoint.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeForCausalLM

from agentloop_grpc.agent import Termination, Trajectory
from agentloop_grpc.common import model_store
from agentloop_grpc.common.routed_experts import Routing
from agentloop_grpc.common.types import GenerateComplete, GenerateRequest, SamplingParams
from agentloop_grpc.integrations.logprob_check import compare
from agentloop_grpc.integrations.trl.routing_replay import (
    RoutingReplay,
    UnsupportedMoeError,
    left_padded_routing,
    moe_routers,
    replay_routing,
    replays,
    trajectory_replay,
)
from tests.embedded import tiny_moe

MOE_LAYERS = tiny_moe.LAYERS - len(tiny_moe.DENSE_LAYERS)


@dataclass(frozen=True)
class Sampled:
    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    routing: Routing


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(checkpoint folder, two sampled turns of different prompt lengths) from the embedded engine."""
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle

    folder = tiny_moe.build(tmp_path_factory.mktemp("tiny-moe"), model_store.prepare())
    prompts = [[1, 17, 230, 4051, 99, 12, 7, 3000, 42, 5], [9, 310, 77, 2048, 5, 61, 8, 1500, 23, 4, 880, 19, 3, 64]]

    async def sample() -> list[Sampled]:
        engine = EngineLifecycle(EmbeddedEngine(EmbeddedEngineConfig(
            model=str(folder), max_running=2, max_model_len=128, threads=1, grammar_workers=1)))
        await engine.start()
        try:
            return list(await asyncio.gather(*(_sample(engine, i, p) for i, p in enumerate(prompts))))
        finally:
            await engine.shutdown()

    return folder, asyncio.run(sample())


async def _sample(engine, index: int, prompt: list[int]) -> Sampled:
    request = GenerateRequest(request_id=f"r{index}", prompt_ids=tuple(prompt), sampling=SamplingParams(
        max_new_tokens=24, temperature=1.0, seed=index, logprobs=True, ignore_eos=True, return_routed_experts=True))
    tokens: list[int] = []
    logprobs: list[float] = []
    routes: list[bytes] = []
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            ids = event.prompt_routed_experts + b"".join(routes)
            return Sampled(prompt, tokens, logprobs, Routing(MOE_LAYERS, tiny_moe.TOP_K, tiny_moe.EXPERTS, ids))
        tokens += event.token_ids
        logprobs += event.logprobs
        routes.append(event.routed_experts)
    raise AssertionError("the stream ended without a completion")


def _trainer_model(folder, sampled: list[Sampled] | None = None) -> Qwen3MoeForCausalLM:
    """The checkpoint as the trainer loads it; with ``sampled``, its router drifted from the engine's by just enough
    to send the nearest tie of the rollout elsewhere: the (position, layer) whose k-th and (k+1)-th expert logits
    are closest gets the (k+1)-th raised past the k-th, as a kernel's rounding does in real training."""
    model = Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    if sampled is None:
        return model
    routers = moe_routers(model)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [r.register_forward_hook(lambda _m, inputs, out: seen.append((inputs[0], out[0]))) for r in routers]
    with torch.no_grad():
        _logprobs(model, sampled, replay=False)
    for hook in hooks:
        hook.remove()
    _, _, routing, _ = _batch(sampled)
    known = routing.reshape(-1, MOE_LAYERS, tiny_moe.TOP_K)[:, 0, 0] >= 0
    margins: list[tuple[float, int, torch.Tensor, int]] = []
    for layer, (hidden, logits) in enumerate(seen):
        top = logits.topk(tiny_moe.TOP_K + 1, dim=-1)
        margin = (top.values[:, -2] - top.values[:, -1]).masked_fill(~known, float("inf"))
        row = int(margin.argmin())
        margins.append((float(margin[row]), layer, hidden[row], int(top.indices[row, -1])))
    nearest, layer, hidden, runner_up = min(margins, key=lambda m: m[0])
    with torch.no_grad():
        routers[layer].weight[runner_up] += 2 * nearest * hidden / hidden.dot(hidden)
    return model


def _batch(sampled: list[Sampled]):
    """TRL's layout: prompts left-padded, completions right-padded; the routing placed alike."""
    prompt_width = max(len(s.prompt) for s in sampled)
    width = prompt_width + max(len(s.tokens) for s in sampled)
    ids = torch.zeros(len(sampled), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(sampled):
        start = prompt_width - len(s.prompt)
        ids[row, start : prompt_width + len(s.tokens)] = torch.tensor(s.prompt + s.tokens)
        mask[row, start : prompt_width + len(s.tokens)] = 1
    routing = left_padded_routing([s.routing for s in sampled], [len(s.prompt) for s in sampled], prompt_width, width)
    return ids, mask, routing, prompt_width


def _logprobs(model, sampled: list[Sampled], replay: bool) -> torch.Tensor:
    """The model's logprob of every sampled token, [rows, tokens], from one batched forward."""
    ids, mask, routing, prompt_width = _batch(sampled)
    with replay_routing(model, routing if replay else None):
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    steps = len(sampled[0].tokens)
    rows = torch.log_softmax(logits[:, prompt_width - 1 : prompt_width - 1 + steps], dim=-1)
    return rows.gather(-1, ids[:, prompt_width : prompt_width + steps, None])[..., 0]


def _gap(model, sampled: list[Sampled], replay: bool) -> float:
    """Mean |engine - trainer| logprob over the sampled tokens."""
    with torch.no_grad():
        trainer = _logprobs(model, sampled, replay)
    return float((trainer - torch.tensor([s.logprobs for s in sampled])).abs().mean())


def test_replay_brings_the_trainers_logprobs_back_to_the_engines(moe) -> None:
    folder, sampled = moe
    assert replays(Qwen3MoeForCausalLM.config_class.from_pretrained(folder))
    assert all(s.routing.positions == len(s.prompt) + len(s.tokens) - 1 for s in sampled)
    same = _trainer_model(folder)
    assert _gap(same, sampled, replay=False) < 1e-4 and _gap(same, sampled, replay=True) < 1e-4

    drifted = _trainer_model(folder, sampled)
    picked: list[torch.Tensor] = []
    hooks = [router.register_forward_hook(lambda _m, _i, out: picked.append(out[2])) for router in moe_routers(drifted)]
    native = _gap(drifted, sampled, replay=False)
    for hook in hooks:
        hook.remove()
    recorded = _batch(sampled)[2].reshape(-1, MOE_LAYERS, tiny_moe.TOP_K)
    own = torch.stack(picked, dim=1)
    known = recorded[:, 0, 0] >= 0
    flipped = int((own[known].sort(-1).values != recorded[known].long().sort(-1).values).any(-1).sum())
    ids, mask, routing, _ = _batch(sampled)
    with torch.no_grad(), RoutingReplay(drifted) as replay:
        replay.bind(routing)
        drifted(input_ids=ids, attention_mask=mask)
        rerouted = replay.rerouted_share()
    replayed = _gap(drifted, sampled, replay=True)
    print(f"\nengine-vs-trainer |dlogp| mean over {sum(len(s.tokens) for s in sampled)} tokens, the trainer's "
          f"router drifted ({flipped} of {int(known.sum()) * MOE_LAYERS} (position, layer) pairs routed "
          f"elsewhere): without replay {native:.4g}, with replay {replayed:.4g}")
    assert flipped > 0 and rerouted == flipped / (int(known.sum()) * MOE_LAYERS)
    assert replayed < native / 10


def test_the_logprob_check_replays_each_trajectorys_routing(moe) -> None:
    """What ``agentloop train`` logs as logprob_diff_policy (replayed) and logprob_diff_policy_unreplayed."""
    folder, sampled = moe
    drifted = _trainer_model(folder, sampled)
    trajectories = [Trajectory(f"s{i}", "tool", tuple(s.prompt), tuple(s.tokens), (1,) * len(s.tokens),
                               tuple(s.logprobs), (0,) * len(s.tokens), 0.0, Termination.LENGTH,
                               routed_experts=s.routing) for i, s in enumerate(sampled)]
    with torch.no_grad():
        replayed, _ = compare(drifted, trajectories, 1.0, replay=lambda t: trajectory_replay(drifted, t))
        native, _ = compare(drifted, trajectories, 1.0)
    assert replayed.tokens == native.tokens == sum(len(s.tokens) for s in sampled)
    assert replayed.mean_abs < native.mean_abs / 10


def test_the_gate_learns_under_replay_also_with_gradient_checkpointing(moe) -> None:
    folder, sampled = moe
    routing = _batch(sampled)[2]
    grads = []
    for checkpointing in (False, True):
        model = _trainer_model(folder, sampled)
        model.train()
        if checkpointing:  # the backward recomputes each layer's forward: the routers must replay there too
            model.gradient_checkpointing_enable({"use_reentrant": False})
        with RoutingReplay(model) as replay:
            replay.bind(routing)
            loss = -_logprobs(model, sampled, replay=False).sum()
            loss.backward()
        grads.append([router.weight.grad.clone() for router in moe_routers(model)])
    for grad in grads[0]:
        assert grad.abs().sum() > 0
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, recomputed)


def test_positions_without_routing_are_routed_by_the_model(moe) -> None:
    folder, sampled = moe
    model = _trainer_model(folder, sampled)
    ids, mask, routing, _ = _batch(sampled)
    with torch.no_grad():
        native = model(input_ids=ids, attention_mask=mask).logits
        with replay_routing(model, torch.full_like(routing, -1)):
            unknown = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(native, unknown, rtol=0, atol=0)
    with pytest.raises(ValueError, match="MoE layers"), RoutingReplay(model) as replay:
        replay.bind(routing[..., :1])
    with pytest.raises(ValueError, match="positions"), torch.no_grad(), replay_routing(model, routing[:1]):
        model(input_ids=ids, attention_mask=mask)


def test_an_unknown_moe_is_refused_by_name_and_a_dense_model_has_no_routers() -> None:
    mixtral = MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=16,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               num_local_experts=4, num_experts_per_tok=2))
    with pytest.raises(UnsupportedMoeError, match="mixtral"):
        moe_routers(mixtral)
    with pytest.raises(UnsupportedMoeError, match="mixtral"):  # from its config, before a trainer loads it
        replays(mixtral.config)
    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert moe_routers(dense) == () and not replays(dense.config)
    with pytest.raises(ValueError, match="no MoE router"):
        RoutingReplay(dense)
