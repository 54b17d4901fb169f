"""Transport overhead: our Router + engine server vs a Ray actor (verl's way) vs a bare grpc.aio echo (the floor).

All three carry the same payload (a 2000-id prompt; one generated token back) to the same fake engine at zero
latency, so what is measured is transport and our own overhead, not an engine:
  (a) Router.generate -> `agentloop engine serve --adapter fake` in another process (gRPC stream),
  (b) a Ray async actor holding the same FakeEngine, called as verl's server manager does
      (`await actor.generate.remote(...)`),
  (c) a bare grpc.aio unary echo of the same bytes in another process: the floor for any gRPC design,
  (d) a bare grpc.aio server stream answering the same GenerateRequest with two fixed messages (one chunk, one
      completion) and no engine: the floor for a streaming Generate in grpc.aio.
Each is run at 1 and 64 calls in flight, REPEATS times; medians are reported. Ends with RATIO lines.

Usage: python bench/transport.py [--calls 2000] [--repeats 3]
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

import grpc

PROMPT = list(range(1000, 3000))  # 2000 int32 ids
BIN = Path(sys.executable).parent


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(call, calls: int, in_flight: int) -> dict[str, float]:
    """Run ``calls`` invocations of ``call(i)`` with ``in_flight`` at a time; return calls/s, p50, p99 (ms)."""
    latencies: list[float] = []
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            start = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - start)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    return {
        "calls_per_s": calls / elapsed,
        "p50_ms": 1000 * _percentile(latencies, 0.5),
        "p99_ms": 1000 * _percentile(latencies, 0.99),
    }


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a server process that prints `... listening on HOST:PORT ...`; return it with its address."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    match = re.search(r"listening on (\S+)", process.stdout.readline())
    if match is None:
        process.kill()
        raise RuntimeError(f"server {args[:3]} failed to start")
    return process, match.group(1)


# -- (c) bare grpc.aio echo ----------------------------------------------------------------------------------

_ECHO_METHOD = "/bench.Echo/Echo"
_STREAM_METHOD = "/bench.Echo/Stream"


async def _serve_echo() -> None:
    from agentloop_grpc.v1 import generation_pb2

    chunk = generation_pb2.GenerateResponse(chunk=generation_pb2.TokenChunk(token_ids=[7])).SerializeToString()
    complete = generation_pb2.GenerateResponse(
        complete=generation_pb2.GenerateComplete(finish_reason=generation_pb2.FINISH_REASON_LENGTH)
    ).SerializeToString()

    async def echo(request: bytes, context) -> bytes:
        return request

    async def stream(request: bytes, context):
        generation_pb2.GenerateRequest.FromString(request)
        yield chunk
        yield complete

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo), "Stream": grpc.unary_stream_rpc_method_handler(stream)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"echo listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def _bench_echo(address: str, calls: int, in_flight: int) -> dict[str, float]:
    payload = b"".join(i.to_bytes(4, "little") for i in PROMPT)
    async with grpc.aio.insecure_channel(address) as channel:
        echo = channel.unary_unary(_ECHO_METHOD)
        await echo(payload)
        return await _drive(lambda i: echo(payload, timeout=30), calls, in_flight)


async def _bench_stream(address: str, calls: int, in_flight: int) -> dict[str, float]:
    from agentloop_grpc.v1 import generation_pb2

    request = generation_pb2.GenerateRequest(
        request_id="x", prompt_ids=PROMPT, sampling_params=generation_pb2.SamplingParams(max_new_tokens=1)
    ).SerializeToString()
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.unary_stream(_STREAM_METHOD)

        async def call(i: int) -> None:
            async for _ in stream(request, timeout=30):
                pass

        await call(0)
        return await _drive(call, calls, in_flight)


# -- (a) Router + engine server ------------------------------------------------------------------------------


async def _bench_router(address: str, calls: int, in_flight: int) -> dict[str, float]:
    from agentloop_grpc.router import Router
    from agentloop_grpc.v1 import generation_pb2

    params = generation_pb2.SamplingParams(max_new_tokens=1, ignore_eos=True)
    async with Router([address]) as router:
        await router.wait_ready()
        await router.generate("warm", PROMPT, params)
        return await _drive(lambda i: router.generate(f"s{i % 64}", PROMPT, params), calls, in_flight)


# -- (b) Ray async actor -------------------------------------------------------------------------------------


def _ray_actor_class():
    import ray

    @ray.remote
    class FakeEngineActor:
        """The same fake engine, behind a Ray async actor as verl's AsyncLLMServerManager reaches its servers."""

        def __init__(self) -> None:
            from agentloop_grpc.engine_adapters.fake import FakeEngine

            self.engine = FakeEngine()
            self.started = False

        async def generate(self, prompt_ids: list[int], sampling: dict, request_id: str) -> dict:
            from agentloop_grpc.engine_adapters.types import GenerateComplete, GenerateRequest, SamplingParams

            if not self.started:
                await self.engine.start()
                self.started = True
            request = GenerateRequest(request_id, tuple(prompt_ids), SamplingParams(**sampling))
            tokens: list[int] = []
            async for event in self.engine.generate(request):
                if isinstance(event, GenerateComplete):
                    return {"token_ids": tokens, "finish_reason": event.finish_reason.value}
                tokens.extend(event.token_ids)
            raise RuntimeError("no completion")

    return FakeEngineActor


async def _bench_ray(actor, calls: int, in_flight: int) -> dict[str, float]:
    sampling = {"max_new_tokens": 1, "ignore_eos": True}
    await actor.generate.remote(PROMPT, sampling, "warm")
    return await _drive(lambda i: actor.generate.remote(PROMPT, sampling, f"r{i}"), calls, in_flight)


# -- main ----------------------------------------------------------------------------------------------------


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        asyncio.run(_serve_echo())
        return 0

    import ray

    processes = []
    try:
        engine, engine_address = _start([str(BIN / "agentloop"), "engine", "serve", "--adapter", "fake", "--port",
                                         "0", "--log-level", "WARNING", "--max-running", "256"])
        processes.append(engine)
        echo, echo_address = _start([sys.executable, __file__, "--serve-echo"])
        processes.append(echo)
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        actor = _ray_actor_class().options(max_concurrency=1000).remote()
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for repeat in range(args.repeats):
            for in_flight in (1, 64):
                for name, run in (
                    ("router", lambda: _bench_router(engine_address, args.calls, in_flight)),
                    ("ray", lambda: _bench_ray(actor, args.calls, in_flight)),
                    ("bare_grpc", lambda: _bench_echo(echo_address, args.calls, in_flight)),
                    ("bare_stream", lambda: _bench_stream(echo_address, args.calls, in_flight)),
                ):
                    outcome = asyncio.run(run())
                    results.setdefault((name, in_flight), []).append(outcome)
                    print(
                        f"repeat {repeat + 1} {name:11s} in_flight {in_flight:2d}: "
                        f"{outcome['calls_per_s']:7.0f} calls/s  p50 {outcome['p50_ms']:6.2f} ms  "
                        f"p99 {outcome['p99_ms']:6.2f} ms",
                        flush=True,
                    )
    finally:
        ray.shutdown()
        for process in processes:
            process.terminate()
            process.wait(30)

    print(f"\nmedians of {args.repeats} runs, {args.calls} calls each, {len(PROMPT)}-id prompt, {os.cpu_count()} cores")
    print(f"{'path':11s} {'in flight':>9s} {'calls/s':>8s} {'p50 ms':>7s} {'p99 ms':>7s}")
    for (name, in_flight), runs in sorted(results.items()):
        print(
            f"{name:11s} {in_flight:9d} {_median(runs, 'calls_per_s'):8.0f} {_median(runs, 'p50_ms'):7.2f} "
            f"{_median(runs, 'p99_ms'):7.2f}"
        )
    for in_flight in (1, 64):
        router, ray_runs, bare, stream = (
            results[(n, in_flight)] for n in ("router", "ray", "bare_grpc", "bare_stream")
        )
        calls_ratio = _median(router, "calls_per_s") / _median(ray_runs, "calls_per_s")
        p50_ratio = _median(router, "p50_ms") / _median(bare, "p50_ms")
        print(f"RATIO router_calls_vs_ray_{in_flight} {calls_ratio:.2f} target 1.5")
        print(f"RATIO router_p50_over_bare_grpc_{in_flight} {p50_ratio:.2f} target 2.0")
        # informative: how far our stack is from the cost of a streaming RPC itself (lower is better)
        stream_ratio = _median(router, "p50_ms") / _median(stream, "p50_ms")
        print(f"RATIO router_p50_over_bare_stream_{in_flight} {stream_ratio:.2f} target 1.2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
