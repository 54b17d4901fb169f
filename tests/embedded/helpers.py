"""Helpers of the embedded-engine tests: build requests, run them to completion, chat prompts, and what
transformers computes for the same prompts (the reference)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from agentloop_grpc.common.types import (
    GenerateComplete,
    GenerateRequest,
    SamplingParams,
    StructuredOutput,
)

_ids = itertools.count()


@dataclass
class Result:
    tokens: list[int]
    logprobs: list[float]
    top: list[tuple[tuple[int, float], ...]]
    complete: GenerateComplete
    versions: set[int]


def make(prompt, structured: StructuredOutput | None = None, **sampling) -> GenerateRequest:
    sampling.setdefault("max_new_tokens", 8)
    return GenerateRequest(
        request_id=f"t-{next(_ids)}",
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(**sampling),
        structured_output=structured,
    )


async def run(engine, request: GenerateRequest) -> Result:
    tokens: list[int] = []
    logprobs: list[float] = []
    top: list[tuple[tuple[int, float], ...]] = []
    versions: set[int] = set()
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return Result(tokens, logprobs, top, event, versions)
        tokens += event.token_ids
        logprobs += event.logprobs
        top += event.top_logprobs
        versions.add(event.weight_version)
    raise AssertionError("the stream ended without a completion")


async def generate(engine, prompt, structured: StructuredOutput | None = None, **sampling) -> Result:
    return await run(engine, make(prompt, structured, **sampling))


def chat(tokenizer, text: str, tools=None, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return list(ids)


def hf_greedy(reference, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Transformers' greedy generation, up to and including eos."""
    model, tokenizer = reference
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    tokens = out[0, len(prompt) :].tolist()
    eos = tokenizer.eos_token_id
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def recompute(reference, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Transformers' log-softmax at every generated position from one full forward pass."""
    model, _ = reference
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + generated])).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)


def assert_serves_reference(served: Result, reference, prompt: list[int]) -> None:
    """``served`` (greedy, logprobs on) is what ``reference`` (transformers, holding the same weights) computes:
    the same tokens up to its eos and the same logprobs."""
    expected = recompute(reference, prompt, served.tokens)
    greedy = hf_greedy(reference, prompt, len(served.tokens))  # up to eos, which the served run ignores
    assert served.tokens[: len(greedy)] == greedy
    chosen = expected[torch.arange(len(served.tokens)), torch.tensor(served.tokens)]
    assert served.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)
