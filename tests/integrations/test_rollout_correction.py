"""The rollout correction: importance weights from the engine's logprobs against the trainer's recompute.

The math on tensors (every mode, the bounds, the metrics by version lag), then one step of TRL's GRPOTrainer on a
tiny random model with a group whose tokens were partly sampled by an older copy of it: the correction changes
the gradient by exactly the stale tokens' terms, fresh tokens get weight 1, and a constrained trajectory's tokens
are left out of the ratio (or weighted, with ``constrained: include``).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentloop_grpc.agent import Termination, Trajectory
from agentloop_grpc.integrations.trl.correction import RolloutCorrection, correction_metrics, importance_weights
from agentloop_grpc.integrations.version_clock import VersionClock

TRAINER = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, -1.0, -1.0, -1.0]])
CORRECTED = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]], dtype=torch.bool)


def behaviour(diffs: list[list[float]]) -> torch.Tensor:
    """Engine logprobs such that trainer - engine = ``diffs``."""
    return TRAINER - torch.tensor(diffs)


def test_fresh_tokens_weigh_one_stale_ones_their_ratio_and_others_are_untouched():
    diffs = [[0.0, math.log(1.5), 7.0, math.log(0.25)], [0.0, 0.0, math.log(3.0), 5.0]]
    w = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("token_truncate", None, 2.0))
    expected = torch.tensor([[1.0, 1.5, 1.0, 0.25], [1.0, 1.0, 2.0, 1.0]])  # 3.0 truncated to 2; uncorrected: 1
    torch.testing.assert_close(w.weights, expected)
    assert w.bounded.tolist() == [[False] * 4, [False, False, True, False]]
    mask = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("token_mask", 0.5, 2.0))
    torch.testing.assert_close(mask.weights, torch.tensor([[1.0, 1.5, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]]))
    assert mask.bounded.sum() == 2


def test_sequence_modes_weigh_each_trajectory_by_its_product():
    diffs = [[math.log(2.0), math.log(1.5), 9.0, 0.0], [0.0, math.log(0.9), 0.0, 9.0]]
    w = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("sequence_truncate", 0.5, 2.0))
    torch.testing.assert_close(w.weights, torch.tensor([[2.0, 2.0, 1.0, 2.0], [0.9, 0.9, 0.9, 1.0]]))
    masked = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("sequence_mask", 0.5, 2.0))
    torch.testing.assert_close(masked.weights, torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.9, 0.9, 0.9, 1.0]]))


def test_decoupled_masks_above_its_cap_only():
    diffs = [[math.log(0.01), math.log(4.0), 0.0, math.log(6.0)], [0.0] * 4]
    w = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("decoupled", None, 5.0))
    torch.testing.assert_close(w.weights[0], torch.tensor([0.01, 4.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="decoupled"):
        RolloutCorrection("decoupled", 0.5, 5.0)


def test_metrics_split_the_ratio_by_version_lag():
    diffs = [[0.0, math.log(1.5), 0.0, math.log(3.0)], [0.0, 0.0, math.log(0.5), 0.0]]
    lag = torch.tensor([[0, 1, -1, 1], [0, 0, 2, -1]])
    w = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("token_truncate", None, 2.0))
    m = correction_metrics(w, lag, RolloutCorrection())
    assert m["correction/count"] == 6 and m["correction/truncated_share"] == pytest.approx(1 / 6)
    assert (m["correction/lag_0/ratio_min"], m["correction/lag_0/ratio_max"]) == (1.0, 1.0)
    assert m["correction/lag_1/ratio_mean"] == pytest.approx(2.25) and m["correction/lag_1/truncated_share"] == 0.5
    assert m["correction/lag_2/ratio_max"] == pytest.approx(0.5)
    seq = importance_weights(TRAINER, behaviour(diffs), CORRECTED, RolloutCorrection("sequence_mask", None, 2.0))
    by_sequence = correction_metrics(seq, lag, RolloutCorrection("sequence_mask", None, 2.0))
    assert by_sequence["correction/count"] == 2 and by_sequence["correction/masked_share"] == 0.5
    assert by_sequence["correction/lag_1/ratio_max"] == pytest.approx(4.5)  # the first row, at its oldest lag


# -- one GRPOTrainer step on a tiny model -----------------------------------------------------------------------
PROMPT = (2, 3)
RESPONSE = (4, 5, 6, 7, 8, 1)
OTHER = (9, 10, 6, 11, 12, 1)  # the group's other trajectory: different tokens, so the plain gradient is not 0
MASK = (1, 1, 0, 1, 1, 1)  # a tool token in the middle


def _tiny():
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 16)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                        pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=0,
                                         eos_token_id=1))
    return model, tokenizer


def _logps(model, response: tuple[int, ...] = RESPONSE) -> torch.Tensor:
    """The model's logprob of each response token after the prompt (temperature 1, TRL's default)."""
    logits = model(input_ids=torch.tensor([PROMPT + response])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _trajectory(sample: str, reward: float, versions: tuple[int, ...], logps: list[float],
                constrained: bool = False, response: tuple[int, ...] = RESPONSE) -> Trajectory:
    return Trajectory(sample, "tool", PROMPT, response, MASK,
                      tuple(lp if m else 0.0 for lp, m in zip(logps, MASK, strict=True)),
                      tuple(v if m else -1 for v, m in zip(versions, MASK, strict=True)),
                      reward, Termination.STOP, constrained=constrained)


class _Steps:
    """One CorrectedGRPOTrainer over a group of ``rolled`` trajectories: ``train`` runs one optimizer step end to
    end, ``gradient`` TRL's batch and loss once more (no new trainer: Trainer.train ends in a full gc.collect,
    seconds in a large test process). The learning rate is 0 so every gradient is taken at the same weights."""

    def __init__(self, model, tokenizer, correction, tmp_path) -> None:
        from transformers import TrainerCallback
        from trl import GRPOConfig

        from agentloop_grpc.integrations.trl import agentloop_reward, prompt_dataset, trl_fields
        from agentloop_grpc.integrations.trl.corrected_trainer import CorrectedGRPOTrainer

        self.model = model
        self.rolled: list[Trajectory] = []
        self.grads: dict[str, torch.Tensor] = {}
        steps = self

        class Grads(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                steps.grads = steps.gradients()

        args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                          gradient_accumulation_steps=1, max_steps=1, learning_rate=0.0, beta=0.0,
                          max_grad_norm=0.0, loss_type="dapo", use_cpu=True, bf16=False, report_to=[],
                          save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0)
        self.prompt = [{"role": "user", "content": "t2"}]
        self.trainer = CorrectedGRPOTrainer(
            model=model, reward_funcs=[agentloop_reward], args=args, processing_class=tokenizer,
            train_dataset=prompt_dataset([{"messages": self.prompt}]), callbacks=[Grads()],
            rollout_func=lambda prompts, trainer: trl_fields(self.rolled, 0),
            correction=correction, version_of=lambda step: step + 1)  # it trains version 1: version 0 is stale

        self.recomputes = 0
        recompute = self.trainer._recompute

        def counted(out: dict, length: int) -> torch.Tensor:
            self.recomputes += 1
            return recompute(out, length)

        self.trainer._recompute = counted  # counts the trainer's extra forwards (an instance attribute)

    def gradients(self) -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def train(self, trajectories) -> tuple[dict[str, torch.Tensor], dict]:
        self.rolled = trajectories
        self.trainer.train()
        self.trainer.version_of = lambda step: step  # global_step is 1 now: the trainer's version stays 1
        return self.grads, next(log for log in self.trainer.state.log_history if "loss" in log)

    def gradient(self, trajectories, correction) -> tuple[dict[str, torch.Tensor], dict]:
        self.rolled, self.trainer.correction = trajectories, correction
        self.model.train()
        self.model.zero_grad()
        self.trainer._metrics["train"].clear()
        # one dict per row: TRL writes each row's extra fields (its reward) into its own
        batch = self.trainer._generate_and_score_completions([{"prompt": self.prompt} for _ in range(2)])
        self.trainer.compute_loss(self.model, batch).backward()
        return self.gradients(), {k: v[-1] for k, v in self.trainer._metrics["train"].items()}


@pytest.fixture(scope="module")
def policies():
    """A tiny model (the trainer's current weights, version 1) and an older copy (version 0) that sampled the
    stale tokens."""
    model, tokenizer = _tiny()
    old = copy.deepcopy(model)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model, old, tokenizer


def test_the_correction_changes_the_gradient_by_exactly_the_stale_tokens_terms(policies, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental: we know
    model, old, tokenizer = policies
    with torch.no_grad():
        fresh, stale, other = _logps(model).tolist(), _logps(old).tolist(), _logps(model, OTHER).tolist()
    versions = (0, 0, -1, 1, 1, 1)  # the second trajectory's first turn was sampled by version 0
    mixed = [lp_old if v == 0 else lp for lp, lp_old, v in zip(fresh, stale, versions, strict=True)]
    group = [_trajectory("a", 1.0, (1,) * 6, other, response=OTHER), _trajectory("b", 0.0, versions, mixed)]
    correction = RolloutCorrection("token_truncate", None, 5.0)

    steps = _Steps(copy.deepcopy(model), tokenizer, correction, tmp_path)
    corrected, logs = steps.train(group)  # one optimizer step through GRPOTrainer, corrected
    plain, _ = steps.gradient(group, None)  # GRPOTrainer's own loss

    # the stale tokens' terms of the DAPO loss, scaled by (w - 1): what the correction must add, and nothing else
    reference = copy.deepcopy(model)
    logp = _logps(reference)
    advantage = -0.5 / (math.sqrt(0.5) + 1e-4)  # trajectory b: reward 0 in a group {1, 0} (TRL: unbiased std)
    stale_tokens = [i for i, v in enumerate(versions) if v == 0]
    weights = {i: min(math.exp(fresh[i] - stale[i]), 5.0) for i in stale_tokens}
    extra = sum(-advantage * (weights[i] - 1.0) * logp[i] for i in stale_tokens) / (2 * sum(MASK))
    extra.backward()
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}

    diff = {n: corrected[n] - plain[n] for n in plain}
    size = math.sqrt(sum(float(d.pow(2).sum()) for d in diff.values()))
    error = math.sqrt(sum(float((diff[n] - expected[n]).pow(2).sum()) for n in diff))
    print(f"gradient difference |corrected - plain| {size:.3e}, |difference - stale terms| {error:.3e}")
    print("weights by lag:", {k: round(v, 4) for k, v in logs.items() if k.startswith("correction/lag_")})
    assert math.sqrt(sum(float(g.pow(2).sum()) for g in plain.values())) > 1e-3  # the plain step has a gradient
    assert size > 1e-4, "the correction did not change the gradient"
    assert error < 1e-3 * size, (error, size)
    assert logs["correction/lag_0/ratio_min"] == pytest.approx(1.0, abs=1e-5)  # fresh: weight 1
    assert logs["correction/lag_0/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert logs["correction/lag_1/count"] == len(stale_tokens)
    assert logs["correction/lag_1/ratio_max"] == pytest.approx(max(math.exp(fresh[i] - stale[i])
                                                                   for i in stale_tokens), rel=1e-4)

    # a constrained trajectory's logprobs are the grammar-masked distribution's: left out of the ratio by default
    inflated = [lp + 0.4 if m else lp for lp, m in zip(mixed, MASK, strict=True)]  # the mass the grammar removed
    constrained = [group[0], _trajectory("b", 0.0, versions, inflated, constrained=True)]
    excluded, logs = steps.gradient(constrained, correction)
    assert logs["correction/excluded_constrained_tokens"] == sum(MASK)
    assert all(torch.allclose(excluded[n], plain[n], atol=1e-7) for n in plain)
    recomputed = steps.recomputes
    every_call_constrained = [_trajectory(t.sample_id, t.reward, t.weight_versions, list(t.response_logprobs),
                                          constrained=True, response=t.response_ids) for t in constrained]
    unweighed, logs = steps.gradient(every_call_constrained, correction)
    assert steps.recomputes == recomputed, "a forward for a batch with no token to weigh"
    assert logs["correction/count"] == 0
    assert all(torch.allclose(unweighed[n], steps.gradient(every_call_constrained, None)[0][n], atol=1e-7)
               for n in plain)
    included, logs = steps.gradient(constrained, RolloutCorrection("token_truncate", None, 5.0, "include"))
    assert logs["correction/excluded_constrained_tokens"] == 0
    assert logs["correction/lag_0/ratio_min"] < 0.7  # fresh tokens weighed down by the removed mass: the bias
    assert not all(torch.allclose(included[n], plain[n], atol=1e-7) for n in plain)

    # a trainer resumed at step 1 on engines that hold version 1 when the run starts: the rollout's clock says it
    # trains version 1, so version-1 tokens are fresh and version-0 ones one version old (counting base + step
    # would call them 1 and 2 versions old)
    clock = VersionClock()
    clock.start(1)
    steps.trainer.version_of = clock.version_of
    _, logs = steps.gradient(group, correction)
    assert logs["correction/lag_0/count"] == sum(m for m, v in zip(MASK, versions, strict=True) if v == 1) + sum(MASK)
    assert logs["correction/lag_1/count"] == len(stale_tokens) and "correction/lag_2/count" not in logs
