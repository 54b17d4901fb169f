"""The scheduler prefills the prompts of several requests in one forward, padded, and each request's first token,
logprob and prompt routing are what it gets prefilled alone.

A forward reads every weight once whatever its batch, so a burst of short prompts (a GRPO group's tails after the
prefix cache, many new sessions) prefilled one request per forward costs a forward each. The scheduler runs on
tests/embedded/tiny_moe.py's random-weight Qwen3-MoE (a few MB, so the test is cheap), driven step by step in
this thread with the real ModelRunner, so the forwards it makes are counted exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.embedded.prefix_cache import PrefixCache
from agentloop_grpc.engine_adapters.embedded.runner import ModelRunner
from agentloop_grpc.engine_adapters.embedded.scheduler import Emission, Scheduler
from agentloop_grpc.engine_adapters.embedded.sequence import Sequence

from . import tiny_moe

MAX_LEN = 64
SLOTS = 8


@pytest.fixture(scope="module")
def runner(moe_checkpoint) -> ModelRunner:
    model = Qwen3MoeForCausalLM.from_pretrained(moe_checkpoint, dtype=torch.float32, local_files_only=True).eval()
    runner = ModelRunner(model, SLOTS, MAX_LEN)
    runner.kv.allocate()
    return runner


def _first_tokens(runner: ModelRunner, prompts: list[list[int]]) -> tuple[list[Emission], list[tuple[int, int]]]:
    """Submit every prompt, then step until each sampled its first token; the emissions in prompt order and the
    ``(rows, length)`` of every prefill forward."""
    scheduler = Scheduler(runner, PrefixCache(16, 0), frozenset(), SLOTS, MAX_LEN, prefill_chunk=16,
                          vocab_size=runner.model.config.vocab_size)
    forwards: list[tuple[int, int]] = []
    forward = runner.forward

    def counted(input_ids, *args, **kwargs):
        if input_ids.shape[1] > 1 or kwargs.get("last") is not None:
            forwards.append(tuple(input_ids.shape))
        return forward(input_ids, *args, **kwargs)

    sequences = []
    for index, prompt in enumerate(prompts):
        sampling = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True, logprobs=True,
                                  return_routed_experts=True)
        sequence = Sequence(GenerateRequest(f"r{index}", prompt, sampling), None, index, list(prompt))
        scheduler.submit(sequence)
        sequences.append(sequence)
    runner.forward = counted  # counts this test's forwards only (an instance attribute, removed after)
    try:
        emissions: dict[str, Emission] = {}
        while scheduler.has_work():
            emissions.update((e.sequence.request_id, e) for e in scheduler.step())
    finally:
        del runner.forward
    return [emissions[s.request_id] for s in sequences], forwards


def _routing(emission: Emission) -> np.ndarray:
    moe_layers = tiny_moe.LAYERS - len(tiny_moe.DENSE_LAYERS)
    data = emission.sequence.prompt_routed_experts + emission.routed_experts
    return routed_experts.unpack(data, moe_layers, tiny_moe.TOP_K, tiny_moe.EXPERTS)


def _assert_as_alone(runner: ModelRunner, prompts: list[list[int]], together: list[Emission]) -> None:
    for prompt, batched in zip(prompts, together):
        [alone], _ = _first_tokens(runner, [prompt])
        assert batched.sampled.token == alone.sampled.token
        assert batched.sampled.logprob == pytest.approx(alone.sampled.logprob, abs=1e-4)
        np.testing.assert_array_equal(_routing(batched), _routing(alone))
        assert _routing(batched).shape[0] == len(prompt)


def test_short_prompts_of_different_lengths_are_prefilled_in_one_forward(runner) -> None:
    prompts = [[100 + 7 * i + j for j in range(5 + i % 4)] for i in range(6)]  # lengths 5..8: padding < 2x
    together, forwards = _first_tokens(runner, prompts)
    assert forwards == [(6, 8)]
    _assert_as_alone(runner, prompts, together)


def test_a_forward_pads_at_most_twice_its_real_tokens(runner) -> None:
    # 16 + 3 real tokens in 2 x 16 may share a forward; 16 + 3 + 4 in 3 x 16 may not
    prompts = [[300 + j for j in range(16)], [400, 401, 402], [500, 501, 502, 503]]
    together, forwards = _first_tokens(runner, prompts)
    assert forwards == [(2, 16), (1, 4)]
    _assert_as_alone(runner, prompts, together)
