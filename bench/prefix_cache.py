"""Prefix cache: 32 sessions x 6 turns, prefill tokens computed and wall time with the cache on vs off.

Each session is a multi-turn chat: a turn's prompt is the previous prompt, the tokens the engine generated for
it and a new user message (token-exact, as the agent loop builds it), so every turn extends the previous one.
All sessions run concurrently (one turn at a time each) on one engine; the same workload runs on an engine
without prefix cache (``prefix_cache_tokens=0``). Prefill tokens computed = prompt tokens - cached prompt tokens
as reported by each request's completion. Medians of REPEATS runs each; the last lines are
``RATIO <name> <value> target <target>``. Targets: with 6 turns whose prompts grow linearly, reuse should cut
prefill work >= 3x and wall time >= 1.5x.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/prefix_cache.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sessions import next_prompt, opening

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import GenerateComplete, GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.embedded import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.embedded.engine import EmbeddedEngine
from agentloop_grpc.engine_adapters.factory import make_adapter

SESSIONS = 32
TURNS = 6
NEW_TOKENS = 8
REPEATS = 3


async def _turn(engine: EmbeddedEngine, request_id: str, prompt: list[int], seed: int):
    request = GenerateRequest(
        request_id,
        tuple(prompt),
        SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=seed),
        session_id=request_id.rsplit("-", 1)[0],
    )
    tokens: list[int] = []
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return tokens, event
        tokens += event.token_ids
    raise RuntimeError("no completion")


async def _session(engine: EmbeddedEngine, tokenizer, tag: str, index: int) -> int:
    prompt = opening(tokenizer, index)
    computed = 0
    for turn in range(TURNS):
        tokens, complete = await _turn(engine, f"{tag}-s{index}-t{turn}", prompt, seed=index * 100 + turn)
        computed += complete.prompt_tokens - complete.cached_prompt_tokens
        prompt = next_prompt(tokenizer, prompt, tokens, index, turn)
    return computed


async def workload(engine: EmbeddedEngine, tokenizer, tag: str, sessions: int = SESSIONS) -> tuple[int, float]:
    await engine.flush_cache()
    start = time.perf_counter()
    computed = await asyncio.gather(*(_session(engine, tokenizer, tag, i) for i in range(sessions)))
    return sum(computed), time.perf_counter() - start


async def measure(cache_tokens: int, tokenizer) -> tuple[float, float]:
    engine = make_adapter("embedded", {"max_running": SESSIONS, "prefix_cache_tokens": cache_tokens})
    await engine.start(lambda: 0)  # no weight updates here: version 0
    try:
        await workload(engine, tokenizer, "warm", sessions=4)
        runs = [await workload(engine, tokenizer, f"r{r}") for r in range(REPEATS)]
    finally:
        await engine.shutdown()
    tokens = statistics.median(t for t, _ in runs)
    wall = statistics.median(w for _, w in runs)
    label = "on " if cache_tokens else "off"
    walls = [round(w, 1) for _, w in runs]
    print(f"cache {label}: prefill tokens computed {tokens:.0f}, wall {wall:.1f} s (runs {walls})")
    return tokens, wall


async def main() -> None:
    tokenizer = model_store.load_tokenizer(model_store.prepare())
    off_tokens, off_wall = await measure(0, tokenizer)
    on_tokens, on_wall = await measure(EmbeddedEngineConfig().prefix_cache_tokens, tokenizer)
    print(f"RATIO prefix_cache_prefill_tokens_off_vs_on {off_tokens / on_tokens:.2f} target 3.0")
    print(f"RATIO prefix_cache_wall_time_off_vs_on {off_wall / on_wall:.2f} target 1.5")


if __name__ == "__main__":
    asyncio.run(main())
