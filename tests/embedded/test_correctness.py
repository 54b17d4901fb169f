"""The embedded engine computes what transformers computes: greedy tokens, logprobs, prefix reuse, seeds."""

from __future__ import annotations

import asyncio

import pytest
import torch

from .helpers import chat, generate, hf_greedy, recompute

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]


async def test_greedy_equals_transformers_generate(engine, reference, tokenizer) -> None:
    prompts = [chat(tokenizer, text) for text in PROMPTS]
    results = await asyncio.gather(*(generate(engine, p, max_new_tokens=24, temperature=0.0) for p in prompts))
    for prompt, result in zip(prompts, results):
        assert result.tokens == hf_greedy(reference, prompt, 24)


async def test_logprobs_equal_a_full_forward_recompute(engine, reference, tokenizer) -> None:
    prompt = chat(tokenizer, PROMPTS[1])
    result = await generate(engine, prompt, max_new_tokens=16, ignore_eos=True, seed=7, logprobs=True, top_logprobs=3)
    expected = recompute(reference, prompt, result.tokens)
    chosen = expected[torch.arange(len(result.tokens)), torch.tensor(result.tokens)]
    assert result.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)
    for position, alternatives in enumerate(result.top):
        values, ids = torch.topk(expected[position], 3)
        assert [t for t, _ in alternatives] == ids.tolist()
        assert [lp for _, lp in alternatives] == pytest.approx(values.tolist(), abs=1e-4)


async def test_greedy_logprobs_are_the_model_distribution(engine, reference, tokenizer) -> None:
    prompt = chat(tokenizer, PROMPTS[0])
    result = await generate(engine, prompt, max_new_tokens=8, ignore_eos=True, temperature=0.0, logprobs=True)
    expected = recompute(reference, prompt, result.tokens)
    assert result.tokens == expected.argmax(dim=-1).tolist()
    chosen = expected[torch.arange(len(result.tokens)), torch.tensor(result.tokens)]
    assert result.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)


async def test_prefix_cache_hit_gives_the_cold_run_exactly(engine, tokenizer) -> None:
    await engine.flush_cache()
    first_turn = chat(tokenizer, PROMPTS[2], system="You are a careful assistant.")
    answer = await generate(engine, first_turn, max_new_tokens=20, temperature=0.0)
    second_turn = first_turn + answer.tokens + tokenizer.encode("<|im_start|>user\nAnd two more?<|im_end|>\n")
    second_turn += tokenizer.encode("<|im_start|>assistant\n")

    def request():
        return generate(engine, second_turn, max_new_tokens=12, ignore_eos=True, seed=11, logprobs=True)

    warm = await request()
    assert warm.complete.cached_prompt_tokens >= len(first_turn) - engine.adapter.config.prefix_block_size
    assert engine.load().prefix_cache_hit_rate > 0
    await engine.flush_cache()
    cold = await request()
    assert cold.complete.cached_prompt_tokens == 0
    assert warm.tokens == cold.tokens
    # cached KV was computed in other chunk shapes (partly by decode steps): equal up to float rounding
    assert warm.logprobs == pytest.approx(cold.logprobs, abs=1e-4)


async def test_seeded_results_do_not_depend_on_the_batch(engine, tokenizer) -> None:
    prompt = chat(tokenizer, PROMPTS[1])

    def seeded():
        return generate(engine, prompt, max_new_tokens=16, ignore_eos=True, seed=1234, logprobs=True, top_p=0.9)

    alone = await seeded()
    noise = [
        generate(engine, chat(tokenizer, "noise " * (3 + 40 * i)), max_new_tokens=6 + 5 * i, ignore_eos=True)
        for i in range(5)
    ]
    batched, *_ = await asyncio.gather(seeded(), *noise)
    assert batched.tokens == alone.tokens
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    other = await generate(engine, prompt, max_new_tokens=16, ignore_eos=True, seed=4321, top_p=0.9)
    assert other.tokens != alone.tokens


async def test_long_prompt_joins_running_decodes_without_changing_them(engine, tokenizer) -> None:
    short = chat(tokenizer, PROMPTS[0])
    long = chat(tokenizer, " ".join(f"item {i}," for i in range(150)) + " Summarise.")  # several prefill chunks
    alone = await generate(engine, short, max_new_tokens=30, ignore_eos=True, temperature=0.0)
    long_alone = await generate(engine, long, max_new_tokens=4, ignore_eos=True, temperature=0.0)
    await engine.flush_cache()

    async def late_long():
        await asyncio.sleep(0.3)
        return await generate(engine, long, max_new_tokens=4, ignore_eos=True, temperature=0.0)

    together, late = await asyncio.gather(
        generate(engine, short, max_new_tokens=30, ignore_eos=True, temperature=0.0), late_long()
    )
    assert together.tokens == alone.tokens
    assert late.tokens == long_alone.tokens


async def test_sampling_controls(engine, tokenizer) -> None:
    prompt = chat(tokenizer, PROMPTS[1])
    top1 = await generate(engine, prompt, max_new_tokens=10, ignore_eos=True, top_k=1, seed=5, logprobs=True)
    greedy = await generate(engine, prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0)
    assert top1.tokens == greedy.tokens
    assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in top1.logprobs)  # sampled from a point mass
    tiny_p = await generate(engine, prompt, max_new_tokens=10, ignore_eos=True, top_p=1e-6, seed=5)
    assert tiny_p.tokens == greedy.tokens
    strict_min_p = await generate(engine, prompt, max_new_tokens=10, ignore_eos=True, min_p=1.0, seed=5)
    assert strict_min_p.tokens == greedy.tokens
    penalised = await generate(
        engine,
        prompt,
        max_new_tokens=40,
        ignore_eos=True,
        temperature=0.0,
        repetition_penalty=1.8,
        presence_penalty=1.0,
        frequency_penalty=1.0,
    )
    plain = await generate(engine, prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    assert penalised.tokens != plain.tokens


async def test_stop_ids_eos_and_budget(engine, tokenizer) -> None:
    prompt = chat(tokenizer, PROMPTS[0])
    reference = await generate(engine, prompt, max_new_tokens=12, ignore_eos=True, temperature=0.0)
    stop = reference.tokens[3]
    stopped = await generate(engine, prompt, max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,))
    assert stopped.tokens == reference.tokens[: reference.tokens.index(stop) + 1]
    assert stopped.complete.matched_stop_token_id == stop
    free = await generate(engine, prompt, max_new_tokens=200, temperature=0.0)
    assert free.tokens[-1] == tokenizer.eos_token_id and free.complete.finish_reason.value == "stop"
    assert free.complete.completion_tokens == len(free.tokens)


async def test_more_requests_than_slots_each_equal_their_solo_run(engine, tokenizer) -> None:
    """Requests queue for slots, join and leave at different steps; slot moves must not disturb anyone's KV."""
    prompts = [chat(tokenizer, f"Describe the number {i} in {3 + i % 4} words.") for i in range(12)]
    budgets = [3 + (7 * i) % 13 for i in range(12)]
    solo = [
        await generate(engine, p, max_new_tokens=b, ignore_eos=True, temperature=0.0) for p, b in zip(prompts, budgets)
    ]
    await engine.flush_cache()
    together = await asyncio.gather(
        *(generate(engine, p, max_new_tokens=b, ignore_eos=True, temperature=0.0) for p, b in zip(prompts, budgets))
    )
    assert len(prompts) > engine.adapter.config.max_running
    for alone, batched in zip(solo, together):
        assert batched.tokens == alone.tokens
