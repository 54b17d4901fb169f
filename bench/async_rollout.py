"""Asynchronous rollout vs lockstep vs the critical-path bound, and 10,000 concurrent trajectories in one worker.

Workload (seeded): 256 trajectories of the tool loop, each of 1-6 assistant turns; every turn but the last calls a
tool, the last answers. Turn lengths are log-normal (median 40 tokens), tool latency log-normal with a heavy tail
(median 0.15 s, sigma 1.0, capped at 5 s). The engine is the fake engine, served on loopback from its own process
(as a real engine runs on its own device), with 4 ms per decode step for a batch of up to 64 requests (continuous
batching) and 20 us of prefill per uncached prompt token; its replies are scripted per session. Everything else
is the real stack: Router, gRPC, the tool loop, template deltas, the in-process tool client.
  async:    one AgentLoopWorker runs every trajectory as its own coroutine (ours),
  lockstep: the same loops, but turn t of any trajectory starts only when every live trajectory finished turn t-1
            (generation and tools): the batch-synchronous rollout,
  bound:    the slowest trajectory's own serial time: its tokens x decode step + its tool latencies (prefill and
            queueing ignored, so it is a lower bound on any schedule's wall time).
Then 10,000 concurrent trajectories (3 turns each) in one worker on a zero-latency fake: turns/s and the resident
memory per in-flight trajectory. Medians of REPEATS runs.

Usage: HF_HUB_OFFLINE=1 python bench/async_rollout.py [--repeats 3] [--trajectories 256] [--concurrent 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil

from agentloop_grpc.agent import (
    AgentLoopConfig,
    AgentLoopWorker,
    LoopContext,
    LoopRegistry,
    Sample,
    SamplingConfig,
)
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.tools.client import InProcessToolClient
from agentloop_grpc.tools.config import ToolLimits
from agentloop_grpc.tools.instances import InstanceManager
from agentloop_grpc.tools.tool import FunctionTool

TOKEN_LATENCY_S = 0.004
PREFILL_S_PER_TOKEN = 0.00002
MAX_RUNNING = 64
EOS = 2


class Plan:
    """The seeded workload: per trajectory, its turn lengths (filler tokens) and tool latencies."""

    def __init__(self, n: int, seed: int, max_turns: int = 6, tool_median_s: float = 0.15) -> None:
        rng = random.Random(seed)
        self.turns = {f"t{i}": rng.randint(1, max_turns) for i in range(n)}
        self.lengths = {
            (s, k): min(200, max(8, int(rng.lognormvariate(math.log(40), 0.6)))) for s, t in self.turns.items()
            for k in range(t)
        }
        self.latency = {
            (s, k): min(5.0, rng.lognormvariate(math.log(tool_median_s), 1.0)) if tool_median_s else 0.0
            for s, t in self.turns.items() for k in range(t - 1)
        }

    def bound_s(self, codec_lengths: dict) -> float:
        return max(
            sum(codec_lengths[(s, k)] * TOKEN_LATENCY_S for k in range(t))
            + sum(self.latency[(s, k)] for k in range(t - 1))
            for s, t in self.turns.items()
        )


class ScriptedModel:
    """The fake engine's script: the reply to a session's k-th turn (a tool call until its last turn)."""

    def __init__(self, codec, plan: Plan) -> None:
        filler = codec.encode(" think")
        self.replies: dict[tuple[str, int], list[int]] = {}
        for (session, turn), length in plan.lengths.items():
            last = turn == plan.turns[session] - 1
            tail = codec.encode("The answer is 7.") if last else codec.encode(
                f'<tool_call>\n{{"name": "work", "arguments": {{"key": "{session}/{turn}"}}}}\n</tool_call>'
            )
            self.replies[(session, turn)] = filler * max(0, length - len(tail)) + tail
        self.calls: dict[str, int] = {}

    def __call__(self, request) -> list[int]:
        turn = self.calls.get(request.session_id, 0)
        self.calls[request.session_id] = turn + 1
        return self.replies[(request.session_id, turn)]


def work_tool(plan: Plan) -> FunctionTool:
    async def work(key: str) -> str:
        """A tool that takes its planned time.

        Args:
            key: Which call this is.
        """
        session, turn = key.split("/")
        await asyncio.sleep(plan.latency[(session, int(turn))])
        return "ok"

    return FunctionTool(work)


class Lockstep:
    """A generator wrapper that makes the rollout batch-synchronous: a trajectory's turn t starts only when every
    live trajectory has finished turn t-1 (arrived at turn t's generation, or ended)."""

    def __init__(self, router: Router, sessions: Sequence[str]) -> None:
        self.router = router
        self.sessions = set(sessions)
        self.arrived: dict[int, set[str]] = {}
        self.finished: set[str] = set()
        self.turn_of: dict[str, int] = {}
        self.changed = asyncio.Condition()
        # the event loop holds a task only weakly: each marking task is kept here until it has run
        self.marking: set[asyncio.Future] = set()

    def _ready(self, turn: int) -> bool:
        return (self.arrived.get(turn, set()) | self.finished) >= self.sessions

    async def generate(self, call: GenerateCall) -> GenerateResult:
        turn = self.turn_of.get(call.session_id, 0)
        self.turn_of[call.session_id] = turn + 1
        async with self.changed:
            self.arrived.setdefault(turn, set()).add(call.session_id)
            self.changed.notify_all()
            await self.changed.wait_for(lambda: self._ready(turn))
        return await self.router.generate(call)

    def close_session(self, session_id: str) -> None:
        self.router.close_session(session_id)

    def done(self, trajectory) -> None:
        async def mark() -> None:
            async with self.changed:
                self.finished.add(trajectory.sample_id)
                self.changed.notify_all()

        task = asyncio.ensure_future(mark())
        self.marking.add(task)
        task.add_done_callback(self.marking.discard)


def _samples(plan: Plan) -> list[Sample]:
    return [Sample(sample_id=s, messages=({"role": "user", "content": f"Task {s}: do the work."},))
            for s in plan.turns]


def _serve_engine(plan: Plan, engine_config: FakeEngineConfig, ports: multiprocessing.Queue, stop) -> None:
    """The engine's process: the fake engine scripted by ``plan``, served on loopback until ``stop`` is set."""

    async def serve() -> None:
        script = ScriptedModel(load_codec(None), plan)
        engine = make_adapter("fake", engine_config.model_copy(update={"script": script}))
        server = await create_server(engine, "127.0.0.1:0")
        await start_adapter(server)
        ports.put(server.port)
        await asyncio.to_thread(stop.wait)
        await server.stop(1)

    asyncio.run(serve())


@contextlib.contextmanager
def _engine_process(plan: Plan, engine_config: FakeEngineConfig) -> Iterator[str]:
    """Run the engine in its own process, as a real engine runs on its own device: in the rollout's process its
    decode steps would wait for the agent loops' CPU work (the step clock then drops the debt beyond 10 ms)."""
    context = multiprocessing.get_context("spawn")
    ports, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve_engine, args=(plan, engine_config, ports, stop), daemon=True)
    process.start()
    try:
        yield f"127.0.0.1:{ports.get(timeout=120)}"
    finally:
        stop.set()
        process.join(30)
        if process.is_alive():
            process.kill()


async def _run(codec, plan: Plan, mode: str, engine_config: FakeEngineConfig, concurrency: int) -> tuple[float, list]:
    async with AsyncExitStack() as stack:
        address = stack.enter_context(_engine_process(plan, engine_config))
        router = await stack.enter_async_context(Router([address], RouterConfig()))
        await router.fleet.wait_ready()
        limits = ToolLimits(max_instances=len(plan.turns) + 10, max_concurrent_executions=len(plan.turns) + 10)
        tools = InProcessToolClient(InstanceManager({"work": work_tool(plan)}, limits))
        specs = {s.name: s for s in await tools.list_tools()}
        samples = _samples(plan)
        generator = Lockstep(router, [s.sample_id for s in samples]) if mode == "lockstep" else router
        config = AgentLoopConfig(max_assistant_turns=8, response_budget=4096, max_new_tokens_per_turn=256,
                                 sampling=SamplingConfig(temperature=0.0), drift_check="off", end_on_tool=())
        context = LoopContext(generator=generator, codec=codec, config=config, tools=tools, tool_specs=specs)
        worker = AgentLoopWorker(LoopRegistry.default(context), max_concurrency=concurrency)
        started = time.perf_counter()
        trajectories = await worker.run(samples, on_done=generator.done if mode == "lockstep" else None)
        wall = time.perf_counter() - started
    failed = [t for t in trajectories if t.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} trajectories failed, e.g. {failed[0].error}")
    return wall, trajectories


async def _concurrent(codec, n: int) -> dict[str, float]:
    plan = Plan(n, seed=7, max_turns=3, tool_median_s=0.0)
    plan.turns = dict.fromkeys(plan.turns, 3)
    plan.lengths = {(s, k): 16 for s in plan.turns for k in range(3)}
    plan.latency = {(s, k): 0.0 for s in plan.turns for k in range(2)}
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    peak = before
    stop = asyncio.Event()

    async def sample_memory() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample_memory())
    config = FakeEngineConfig(vocab_size=49_152, eos_token_id=EOS, max_running=1024, max_waiting=n + 1024)
    wall, trajectories = await _run(codec, plan, "async", config, concurrency=n)
    stop.set()
    await sampler
    turns = sum(t.assistant_turns for t in trajectories)
    return {"turns_per_s": turns / wall, "wall_s": wall, "kib_per_trajectory": (peak - before) / n / 1024}


async def main_async(args) -> None:
    codec = load_codec(None)
    engine = FakeEngineConfig(vocab_size=49_152, eos_token_id=EOS, token_latency_s=TOKEN_LATENCY_S,
                              prefill_latency_s_per_token=PREFILL_S_PER_TOKEN, max_running=MAX_RUNNING)
    results: dict[str, list[float]] = {"async": [], "lockstep": [], "bound": []}
    for repeat in range(args.repeats):
        plan = Plan(args.trajectories, seed=repeat)
        lengths = {}
        for mode in ("async", "lockstep"):
            wall, trajectories = await _run(codec, plan, mode, engine, concurrency=args.trajectories)
            results[mode].append(wall)
            for t in trajectories:  # tokens the model produced per turn (script + eos), for the bound
                model_runs = _model_runs(t.response_mask)
                for k, n in enumerate(model_runs):
                    lengths[(t.sample_id, k)] = n
        results["bound"].append(plan.bound_s(lengths))
        print(f"repeat {repeat}: async {results['async'][-1]:.2f} s, lockstep {results['lockstep'][-1]:.2f} s, "
              f"bound {results['bound'][-1]:.2f} s", flush=True)
    many = await _concurrent(codec, args.concurrent)
    median = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n{args.trajectories} trajectories x 1-6 turns, medians of {args.repeats}:")
    print(f"| async | lockstep | critical-path bound |\n|---|---|---|\n"
          f"| {median['async']:.2f} s | {median['lockstep']:.2f} s | {median['bound']:.2f} s |")
    print(f"{args.concurrent} concurrent trajectories x 3 turns, zero-latency fake: {many['turns_per_s']:.0f} turns/s, "
          f"{many['wall_s']:.1f} s, {many['kib_per_trajectory']:.1f} KiB per trajectory (peak RSS growth)")
    print(f"RATIO async_rollout_lockstep_over_async {median['lockstep'] / median['async']:.2f} target 2.0")
    print(f"RATIO async_rollout_wall_over_bound {median['async'] / median['bound']:.2f} target 1.3")
    print(f"RATIO async_rollout_turns_per_s_{args.concurrent} {many['turns_per_s']:.0f} target 0")


def _model_runs(mask: Sequence[int]) -> list[int]:
    runs, current = [], 0
    for m in mask:
        if m:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=256)
    parser.add_argument("--concurrent", type=int, default=10_000)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
