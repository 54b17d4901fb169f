"""`agentloop train` on a mixture-of-experts model with routing replay: the tiny Qwen3-MoE (tests/embedded/tiny_moe.py)
served by an embedded engine the CLI launches, its rollouts recording routed experts, TRL's trainer replaying them;
each step's metrics hold the engine-vs-trainer logprob difference with replay and without; the train process never
imports vLLM."""

from __future__ import annotations

import json

import yaml

from agentloop_grpc.common import model_store
from tests.embedded import tiny_moe

from .test_train_cli import _config, run_train


def test_two_steps_on_a_moe_model_replay_its_routing_and_log_the_gap(tmp_path):
    checkpoint = tiny_moe.build(tmp_path / "tiny-moe", model_store.prepare())
    config = _config(tmp_path, report_to=[], save_model=False, check_logprobs=2,
                     grpo={"max_steps": 2, "prompts_per_step": 1, "num_generations": 2},
                     loop={"constrain_tool_calls": False, "max_assistant_turns": 1, "max_new_tokens_per_turn": 8,
                           "response_budget": 16, "drift_check": "off", "sampling": {"temperature": 1.0, "seed": 0}})
    document = yaml.safe_load(config.read_text())
    document["engines"]["launch"]["engine"].update(model=str(checkpoint), max_model_len=512, threads=1,
                                                   grammar_workers=1)
    document["dataset"]["arithmetic"]["count"] = 1
    config.write_text(yaml.safe_dump(document))
    result, imported = run_train(config, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # GRPOTrainer's module imports TRL's vLLM generation, which imports vLLM wherever it is installed: not here
    assert "trl.generation.vllm_generation" in imported and "vllm" not in {m.partition(".")[0] for m in imported}
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        print(f"step {step['step']}: engine-vs-trainer |dlogp| mean over {step['logprob_diff_policy_tokens']:g} "
              f"tokens: with replay {step['logprob_diff_policy_mean']:.4g}, without "
              f"{step['logprob_diff_policy_unreplayed_mean']:.4g}")
        assert step["routing_replay/rows"] == 1.0  # every trajectory brought its routing to the trainer
        # the loss's forward routed as the engine did: the routing sat beside its own tokens in TRL's batch
        assert step["routing_replay/rerouted_share"] < 0.01
        assert step["logprob_diff_policy_tokens"] > 0
        # the same weights in engine and trainer: replayed, only float rounding is left
        assert step["logprob_diff_policy_mean"] < 1e-4
