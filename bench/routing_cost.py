"""What recording a MoE model's routed experts costs (routing replay, ``return_routed_experts``), each case against
the same case without routing, measured in the same run.

1. Size: routing bytes per token for common MoE shapes against the bytes the token stream carries anyway (an int32
   id, a float32 logprob), and the GenerateResponse of a 1,000-token turn (prompt of 1,000 too) of a 48-layer top-8
   model, serialized: the wire's figure.
2. Router: fake engine servers in a child process standing in for a 48-layer top-8, 128-expert model (zero latency:
   the transport's and the Router's costs are all there is), --in-flight calls at once, each a 1,000-id prompt and
   256 generated tokens, with and without routing, alternating per repeat: the Router process's CPU per call and
   the wall time per call (which includes the fake servers' own making of the routing). Each RATIO is the median
   of the ratios paired within a repeat (the host is shared).
3. Parquet: --trajectories trajectories (1,000 prompt and 2,000 response tokens, the same shape) written and read
   back with and without routing: file size and seconds.
4. The embedded engine serving tests/embedded/tiny_moe.py's Qwen3-MoE (3 layers, top-2 of 8): 3-turn sessions
   through the Router with and without routing, wall seconds per turn. With routing the engine computes each
   prompt whole (its prefix cache holds no routing): the real engine's price of the opt-in, on a model whose
   layers are cheap, so the re-prefill's share is large.

Usage: python bench/routing_cost.py [--repeats 5] [--calls 64] [--in-flight 8] [--trajectories 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/embedded/tiny_moe.py builds the MoE checkpoint
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import numpy as np  # noqa: E402

from agentloop_grpc.common import routed_experts  # noqa: E402
from agentloop_grpc.common.types import SamplingParams  # noqa: E402
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig  # noqa: E402
from agentloop_grpc.router import GenerateCall, Router, RouterConfig  # noqa: E402

#: (name, MoE layers, top-k, experts per layer), from the models' configs
SHAPES = (
    ("Qwen3-30B-A3B", 48, 8, 128),
    ("Qwen3-235B-A22B", 94, 8, 128),
    ("DeepSeek-V3", 58, 8, 256),
    ("gpt-oss-120b", 36, 4, 128),
    ("Qwen3-Next-80B", 48, 10, 512),
)
LAYERS, TOP_K, EXPERTS = 48, 8, 128
PROMPT, GENERATED = 1000, 256


def size_section() -> list[str]:
    from agentloop_grpc.common.types import FinishReason, GenerateComplete, TokenChunk
    from agentloop_grpc.engine_adapters import convert
    from agentloop_grpc.v1 import generation_pb2

    print("1. size: routing bytes per token, against the token stream's 8 (int32 id + float32 logprob)")
    print(f"{'model':18s} {'layers':>6s} {'top-k':>5s} {'experts':>7s} {'bytes/token':>11s} {'x stream':>8s}")
    for name, layers, top_k, experts in SHAPES:
        per_token = routed_experts.wire_bytes(1, layers, top_k, experts)
        print(f"{name:18s} {layers:6d} {top_k:5d} {experts:7d} {per_token:11d} {per_token / 8:8.0f}")
    tokens = 1000
    sizes = {}
    for routed in (False, True):
        ids = np.random.default_rng(0).integers(0, EXPERTS, (tokens, LAYERS, TOP_K))
        packed = routed_experts.pack(ids, EXPERTS) if routed else b""
        message = generation_pb2.GenerateResponse()
        convert.fill_complete(
            message.complete,
            GenerateComplete(finish_reason=FinishReason.LENGTH, prompt_tokens=tokens + 1, completion_tokens=tokens,
                             weight_version=0, prompt_routed_experts=packed),
            TokenChunk(token_ids=tuple(range(tokens)), weight_version=0, logprobs=(-0.5,) * tokens,
                       routed_experts=packed),
        )
        sizes[routed] = message.ByteSize()
    print(f"a 1,000-token turn of a {LAYERS}-layer top-{TOP_K} model (prompt of 1,000), one final message: "
          f"{sizes[False]:,} bytes without routing, {sizes[True]:,} with")
    # what the routing adds to the message over its raw ids (prompt's and tokens'): the packing's framing
    return [f"RATIO routing_cost_message_bytes_per_routing_byte "
            f"{(sizes[True] - sizes[False]) / (2 * tokens * LAYERS * TOP_K):.4f} target 1.001"]


async def _calls(addresses: list[str], calls: int, in_flight: int, routed: bool) -> tuple[float, float]:
    """(Router CPU seconds per call, wall seconds per call) of ``calls`` generations, ``in_flight`` at once."""
    sampling = SamplingParams(max_new_tokens=GENERATED, temperature=0, ignore_eos=True, logprobs=True,
                              return_routed_experts=routed)
    config = RouterConfig(load_poll_interval_s=0.5)
    async with Router(addresses, config) as router:
        await router.fleet.wait_ready(len(addresses))
        queue = list(range(calls))

        async def worker() -> None:
            while queue:
                i = queue.pop()
                result = await router.generate(GenerateCall(f"s{i}", [(i * 7 + j) % 30_000 for j in range(PROMPT)],
                                                            sampling))
                assert len(result.token_ids) == GENERATED
                assert (result.routed_experts is not None) == routed

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls


def router_section(repeats: int, calls: int, in_flight: int) -> list[str]:
    sys.path.insert(0, str(ROOT / "bench"))
    from fake_fleet import fake_servers

    config = FakeEngineConfig(routed_expert_layers=LAYERS, routed_experts_per_token=TOP_K, num_experts=EXPERTS,
                              max_model_len=4096)
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with fake_servers(2, config) as (addresses, _pids):
        asyncio.run(_calls(addresses, in_flight, in_flight, False))  # warm-up: connections, caches
        for repeat in range(repeats):
            for routed in (False, True) if repeat % 2 == 0 else (True, False):
                runs[routed].append(asyncio.run(_calls(addresses, calls, in_flight, routed)))
    cpu = [w[0] / wo[0] for w, wo in zip(runs[True], runs[False], strict=True)]
    wall = [w[1] / wo[1] for w, wo in zip(runs[True], runs[False], strict=True)]
    tokens_bytes = routed_experts.wire_bytes(GENERATED, LAYERS, TOP_K, EXPERTS)
    prompt_bytes = routed_experts.wire_bytes(PROMPT - 1, LAYERS, TOP_K, EXPERTS)
    print(f"\n2. Router: {calls} calls x {repeats} repeats, {in_flight} in flight, {PROMPT}-id prompt, {GENERATED} "
          f"tokens, {LAYERS}x{TOP_K} of {EXPERTS} experts ({tokens_bytes:,} bytes of token routing + "
          f"{prompt_bytes:,} of prompt's)")
    for routed in (False, True):
        cpu_ms = statistics.median(r[0] for r in runs[routed]) * 1e3
        wall_ms = statistics.median(r[1] for r in runs[routed]) * 1e3
        print(f"{'with' if routed else 'without':8s} routing: Router CPU {cpu_ms:7.2f} ms/call, wall {wall_ms:7.2f} "
              "ms/call")
    print(f"paired ratios, CPU: {' '.join(f'{r:.2f}' for r in cpu)}; wall: {' '.join(f'{r:.2f}' for r in wall)}")
    # the wall time includes the fake servers' own making of the routing (numpy, in their process): shown, not a
    # figure of the Router's
    return [f"RATIO routing_cost_router_cpu_per_call {statistics.median(cpu):.2f} target 2.0"]


def _trajectories(count: int, routed: bool):
    from agentloop_grpc.agent.trajectory import Termination, Trajectory

    rng = np.random.default_rng(1)
    out = []
    for i in range(count):
        prompt, response = 1000, 2000
        routing = None
        if routed:
            ids = rng.integers(0, EXPERTS, (prompt + response - 1, LAYERS, TOP_K))
            routing = routed_experts.Routing(LAYERS, TOP_K, EXPERTS, routed_experts.pack(ids, EXPERTS))
        out.append(Trajectory(
            sample_id=f"t{i}", loop="tool", prompt_ids=tuple(rng.integers(0, 30_000, prompt).tolist()),
            response_ids=tuple(rng.integers(0, 30_000, response).tolist()), response_mask=(1,) * response,
            response_logprobs=(-0.5,) * response, weight_versions=(0,) * response, reward=1.0,
            termination=Termination.STOP, routed_experts=routing))
    return out


def parquet_section(count: int, repeats: int) -> list[str]:
    from agentloop_grpc.agent.parquet import read_parquet, write_parquet

    figures: dict[bool, dict[str, list[float]]] = {r: {"bytes": [], "write": [], "read": []} for r in (False, True)}
    raw = 0
    with tempfile.TemporaryDirectory() as folder:
        read_parquet(write_parquet(_trajectories(1, True), Path(folder) / "warm-up.parquet"))  # imports, first use
        for routed in (False, True):
            trajectories = _trajectories(count, routed)
            raw = sum(len(t.routed_experts.ids) for t in trajectories if t.routed_experts is not None) or raw
            for repeat in range(repeats):
                path = Path(folder) / f"{routed}-{repeat}.parquet"
                started = time.perf_counter()
                write_parquet(trajectories, path)
                figures[routed]["write"].append(time.perf_counter() - started)
                started = time.perf_counter()
                back = read_parquet(path)
                figures[routed]["read"].append(time.perf_counter() - started)
                figures[routed]["bytes"].append(path.stat().st_size)
                assert back[0].routed_experts == trajectories[0].routed_experts
    med = {r: {k: statistics.median(v) for k, v in f.items()} for r, f in figures.items()}
    print(f"\n3. Parquet: {count} trajectories of 1,000 + 2,000 tokens, {LAYERS}x{TOP_K} routing "
          f"({raw / count / 1e6:.2f} MB raw each), medians of {repeats}")
    for routed in (False, True):
        m = med[routed]
        print(f"{'with' if routed else 'without':8s} routing: {m['bytes'] / 1e6:8.1f} MB, write {m['write']:6.2f} s, "
              f"read {m['read']:6.2f} s")
    added = (med[True]["bytes"] - med[False]["bytes"]) / raw
    return [f"RATIO routing_cost_parquet_bytes_per_routing_byte {added:.2f} target 1.0",
            f"RATIO routing_cost_parquet_write_s {med[True]['write'] / med[False]['write']:.1f} target "
            f"{med[True]['bytes'] / med[False]['bytes']:.1f}",
            f"RATIO routing_cost_parquet_read_s {med[True]['read'] / med[False]['read']:.1f} target "
            f"{med[True]['bytes'] / med[False]['bytes']:.1f}"]


async def _sessions(address: str, routed: bool, sessions: int, turns: int) -> float:
    """Wall seconds per turn of ``sessions`` concurrent sessions of ``turns`` turns (64 generated tokens and 64
    appended ids a turn, a 100-id first prompt)."""
    async with Router([address]) as router:
        await router.fleet.wait_ready()

        async def session(s: int) -> None:
            context = [(s * 31 + j) % 40_000 + 5 for j in range(100)]
            for turn in range(turns):
                result = await router.generate(GenerateCall(f"{routed}-{s}", context, SamplingParams(
                    max_new_tokens=64, temperature=0, ignore_eos=True, return_routed_experts=routed)))
                context += [*result.token_ids, *((turn * 13 + j) % 40_000 + 5 for j in range(64))]
            router.close_session(f"{routed}-{s}")

        started = time.perf_counter()
        await asyncio.gather(*(session(s) for s in range(sessions)))
        return (time.perf_counter() - started) / (sessions * turns)


def embedded_section(repeats: int) -> list[str]:
    from agentloop_grpc.common import model_store
    from agentloop_grpc.engine_adapters.factory import make_adapter
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter
    from tests.embedded import tiny_moe

    async def run(folder: Path) -> dict[bool, list[float]]:
        adapter = make_adapter("embedded", {"model": str(folder), "max_running": 8, "max_model_len": 512})
        server = await create_server(adapter, "127.0.0.1:0")
        await start_adapter(server)
        try:
            address = f"127.0.0.1:{server.port}"
            await _sessions(address, False, 2, 1)  # warm-up
            times: dict[bool, list[float]] = {False: [], True: []}
            for repeat in range(repeats):
                for routed in (False, True) if repeat % 2 == 0 else (True, False):
                    times[routed].append(await _sessions(address, routed, 4, 3))
            return times
        finally:
            await server.stop(grace_s=1)

    with tempfile.TemporaryDirectory() as folder:
        times = asyncio.run(run(tiny_moe.build(Path(folder), model_store.prepare())))
    ratios = [w / wo for w, wo in zip(times[True], times[False], strict=True)]
    print(f"\n4. embedded engine, tiny Qwen3-MoE: 4 sessions x 3 turns (100-id prompt, 64 tokens a turn, 64 ids "
          f"appended), medians of {repeats}")
    for routed in (False, True):
        print(f"{'with' if routed else 'without':8s} routing: {statistics.median(times[routed]) * 1e3:7.1f} ms/turn")
    print(f"paired ratios: {' '.join(f'{r:.2f}' for r in ratios)}")
    return [f"RATIO routing_cost_embedded_moe_turn_s {statistics.median(ratios):.2f} target 1.5"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=64, help="Router calls per case and repeat")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--trajectories", type=int, default=32, help="trajectories in the Parquet case")
    parser.add_argument("--skip-embedded", action="store_true", help="leave out the embedded engine's case")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    lines = size_section()
    lines += router_section(args.repeats, args.calls, args.in_flight)
    lines += parquet_section(args.trajectories, args.repeats)
    if not args.skip_embedded:
        lines += embedded_section(args.repeats)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
