"""Session affinity: 2 embedded engine servers, 32 sessions x 6 turns, sticky Router vs round-robin.

Each session is a multi-turn chat whose every turn extends the previous one (the previous prompt, the tokens the
engine generated, a new user message), so the previous turn's KV is reusable if the turn lands on the same
server. Measured per mode: the share of reusable prompt tokens (previous prompt + previous output) that the
engines served from their prefix caches, and the wall time of the whole workload.
  sticky:      the Router (least-loaded placement, then affinity),
  round-robin: turn t of session s goes to server (s + t) mod 2 (a load balancer without affinity).
Two server processes share this machine's cores (one torch thread each). Medians of REPEATS runs.

Usage: HF_HUB_OFFLINE=1 python bench/affinity.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sessions import next_prompt, opening

from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router import GenerateCall, Router, RouterConfig

SESSIONS = 32
TURNS = 6
NEW_TOKENS = 8
BIN = Path(sys.executable).parent


def _start_server() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [str(BIN / "agentloop"), "engine", "serve", "--adapter", "embedded", "--port", "0", "--set", "threads=1",
         "--set", "max_running=16", "--set", "max_model_len=2048", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    match = re.search(r"listening on (\S+)", process.stdout.readline())
    if match is None:
        process.kill()
        raise RuntimeError("embedded server failed to start")
    return process, match.group(1)


async def _session(pick, tokenizer, index: int, tag: str) -> tuple[int, int]:
    """Run one session; return (reusable prompt tokens, cached prompt tokens) over its turns after the first."""
    prompt = opening(tokenizer, index)
    reusable = cached = 0
    previous_total = 0
    for turn in range(TURNS):
        router = pick(index, turn)
        params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=index * 100 + turn)
        result = await router.generate(GenerateCall(f"{tag}-s{index}", prompt, params))
        if turn:
            reusable += previous_total
            cached += result.cached_prompt_tokens
        previous_total = len(prompt) + len(result.token_ids)
        prompt = next_prompt(tokenizer, prompt, list(result.token_ids), index, turn)
    return reusable, cached


async def _workload(pick, flush, tokenizer, tag: str) -> tuple[float, float]:
    await flush()
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(_session(pick, tokenizer, i, tag) for i in range(SESSIONS)))
    wall = time.perf_counter() - started
    reusable = sum(r for r, _ in outcomes)
    cached = sum(c for _, c in outcomes)
    return cached / reusable, wall


async def _measure(addresses: list[str], repeats: int, tokenizer) -> dict[str, list[tuple[float, float]]]:
    config = RouterConfig(load_poll_interval_s=0.2)
    async with Router(addresses, config) as sticky, Router([addresses[0]]) as first, Router([addresses[1]]) as second:
        for router in (sticky, first, second):
            await router.fleet.wait_ready(timeout_s=300)

        async def flush() -> None:
            (await sticky.fleet.flush_cache()).raise_for_errors()

        modes = {
            "sticky": lambda index, turn: sticky,
            "round_robin": lambda index, turn: (first, second)[(index + turn) % 2],
        }
        await _workload(modes["sticky"], flush, tokenizer, "warm")
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for repeat in range(repeats):
            for name, pick in modes.items():
                share, wall = await _workload(pick, flush, tokenizer, f"{name}{repeat}")
                runs[name].append((share, wall))
                print(f"repeat {repeat + 1} {name:11s}: prefix hit share {share:.3f}  wall {wall:.1f} s", flush=True)
        moved = sticky.metrics.value("agentloop_router_routing_decisions_total", decision="moved")
        print(f"sticky router: {moved:.0f} session moves (bounded imbalance)")
        return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = model_store.load_tokenizer(model_store.prepare())
    servers = []
    try:
        for _ in range(2):
            servers.append(_start_server())
        runs = asyncio.run(_measure([address for _, address in servers], args.repeats, tokenizer))
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(60)
    share = {name: statistics.median(s for s, _ in r) for name, r in runs.items()}
    wall = {name: statistics.median(w for _, w in r) for name, r in runs.items()}
    print(f"\nmedians of {args.repeats}: {SESSIONS} sessions x {TURNS} turns, {NEW_TOKENS} new tokens a turn")
    for name in runs:
        print(f"{name:11s}: prefix hit share {share[name]:.3f}  wall {wall[name]:.1f} s")
    print(f"RATIO affinity_prefix_hit_share_sticky {share['sticky']:.3f} target 0.85")
    print(f"RATIO affinity_wall_round_robin_vs_sticky {wall['round_robin'] / wall['sticky']:.2f} target 1.2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
