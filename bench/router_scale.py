"""Router scale by simulation: one Router's CPU per call and memory over many fake engine servers and many live
sessions, and W worker Routers sharing the sessions over the same servers.

Servers: up to 256 fake engine servers at zero latency (the fake's own scheduler and prefix cache), 64 to a child
process, each process one asyncio loop serving its share: 256 servers cost four processes, not 256. A Router routes
over the first S of them; the others idle.

A run (S servers, L sessions) is one Router in a child process of its own with ``RouterConfig.max_sessions = L``
(every session stays remembered; the table never holds more: tests/router/test_session_table.py runs a million
sessions through it) and C calls in flight:
  1. ready: wait until all S servers are SERVING, then 2 s idle: the background CPU per second (S health watches,
     S GetLoad polls every load_poll_interval_s);
  2. open: the first call of each of L sessions, GRPO groups of 8 sharing their group's 256-id prompt (4 of the
     Router's prefix blocks): each placed (cache_aware: its group's server, else its prefix's, else the least
     loaded);
  3. sticky: K more calls, each on a live session drawn at random: the steady state of many multi-turn sessions.
Each call asks one token (GenerateUnary). Measured in the Router's process: CPU time (user + system, every thread,
gRPC's included, and so the background of step 1) per call of step 2 and of step 3; the resident memory (RSS, after
a garbage collection and glibc's malloc_trim) it gained from the end of step 1 to the end of step 3 (L live
sessions); the live sessions it remembers at the end; the GetLoad polls it sent during step 3 (a count the host's
load does not blur, unlike CPU time).
Workers: W Router processes at once, each with L/W sessions and K/W sticky calls, over the same S servers: CPU per
call of each (each watches and polls every server, so its background falls on fewer calls).

The servers and the Routers share the host's cores, so CPU per call is the figure, not calls per second (printed
beside it); a busier host raises CPU per call too (caches, switches), so the smallest scale runs again before each
other one and a ratio pairs a run with the one just before it. RATIO lines: sticky CPU per call at (256 servers,
100k sessions) over (4, 1k), target 1.5 (flat in servers and sessions); the same for a session's first (placed)
call, target 1.5; the memory gained with 100k live sessions over 10k, target 10 (at most linear in live sessions,
which max_sessions bounds); a worker Router's sticky CPU per call (W of them, L/W sessions each) over the single
Router's at the same scale, target 1.5; and the worker Routers' GetLoad polls per sticky call (no target).

Usage: python bench/router_scale.py [--quick] [--scales 4x1000,256x100000] [--in-flight 64]
                                    [--sticky-calls 10000] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import multiprocessing
import os
import random
import statistics
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

from fake_fleet import fake_servers

from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SERVERS_PER_PROCESS = 64
GROUP_SIZE = 8
PROMPT_IDS = 256
VOCAB = 32_000
IDLE_S = 2.0


@dataclass(frozen=True, slots=True)
class Scale:
    """One run: ``servers`` servers, ``sessions`` live sessions over ``routers`` Router processes."""

    servers: int
    sessions: int
    routers: int = 1

    @property
    def name(self) -> str:
        sessions = f"{self.sessions // 1000}k" if self.sessions >= 1000 else str(self.sessions)
        return f"{self.servers}x{sessions}" + (f"/{self.routers}w" if self.routers > 1 else "")


FULL = (Scale(4, 1_000), Scale(64, 10_000), Scale(256, 1_000), Scale(256, 10_000), Scale(256, 100_000))
QUICK = (Scale(4, 200), Scale(16, 1_000))


# -- servers --------------------------------------------------------------------------------------------------------

# -- one Router -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RouterRun:
    """What one Router process measured."""

    idle_cpu_per_s: float
    open_calls: int
    open_cpu_s: float
    open_wall_s: float
    sticky_calls: int
    sticky_cpu_s: float
    sticky_wall_s: float
    rss_gain: int
    live_sessions: int
    #: GetLoad polls the Router sent during the sticky calls (a count the host's load does not blur).
    sticky_polls: int = 0

    @property
    def open_us(self) -> float:
        return 1e6 * self.open_cpu_s / self.open_calls

    @property
    def sticky_us(self) -> float:
        return 1e6 * self.sticky_cpu_s / self.sticky_calls


def _rss() -> int:
    """Resident bytes, once garbage is collected and glibc has handed back the heap's free pages (else free
    memory left by start-up hides the first megabytes a run adds)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_BODY = array("i", random.Random(0).choices(range(3, VOCAB), k=PROMPT_IDS - 1))


def _prompt(group: int) -> array:
    """A GRPO group's prompt: its own first id, then ids all groups share (the Router's prefix blocks are chained,
    so every group's differ from the first). Built per call, not kept: the Router's process holds only what the
    Router keeps."""
    return array("i", (3 + group % (VOCAB - 3),)) + _BODY


async def _route(addresses: Sequence[str], first: int, sessions: int, sticky: int, in_flight: int,
                 ready) -> RouterRun:
    from agentloop_grpc.common.types import SamplingParams
    from agentloop_grpc.router import GenerateCall, Router, RouterConfig

    params = SamplingParams(max_new_tokens=1, ignore_eos=True)

    async def call(index: int) -> None:
        group = index // GROUP_SIZE
        await router.generate(GenerateCall(f"s{index}", _prompt(group), params, group_id=f"g{group}"))

    async def drive(indices: Iterator[int]) -> None:
        async def worker() -> None:
            for index in indices:
                await call(index)

        await asyncio.gather(*(worker() for _ in range(in_flight)))

    config = RouterConfig(max_sessions=sessions)
    async with Router(list(addresses), config) as router:
        await router.fleet.wait_ready(min_servers=len(addresses), timeout_s=300)
        polls = _count_polls(router)
        await asyncio.to_thread(ready.wait)  # every Router of the run is ready: they start together
        cpu = time.process_time()
        await asyncio.sleep(IDLE_S)
        idle_cpu_per_s = (time.process_time() - cpu) / IDLE_S
        rss = _rss()
        # 2. the first call of every session: each is placed
        cpu, wall = time.process_time(), time.perf_counter()
        await drive(iter(range(first, first + sessions)))
        open_cpu, open_wall = time.process_time() - cpu, time.perf_counter() - wall
        # 3. sticky calls on live sessions
        rng = random.Random(first)
        cpu, wall, polled = time.process_time(), time.perf_counter(), polls[0]
        await drive(first + rng.randrange(sessions) for _ in range(sticky))
        sticky_cpu, sticky_wall = time.process_time() - cpu, time.perf_counter() - wall
        return RouterRun(idle_cpu_per_s, sessions, open_cpu, open_wall, sticky, sticky_cpu, sticky_wall,
                         _rss() - rss, router.live_sessions, polls[0] - polled)


def _count_polls(router) -> list[int]:
    """Count the GetLoad polls of every server from now on (the list's one element): the bench's own wrapper
    around each server's stub, so every version of the Router is counted alike."""
    polls = [0]
    for endpoint in router.fleet.servers.values():
        def counted(*args, _get_load=endpoint.generate.GetLoad, **kwargs):
            polls[0] += 1
            return _get_load(*args, **kwargs)

        endpoint.generate.GetLoad = counted
    return polls


def _router_process(addresses: list[str], first: int, sessions: int, sticky: int, in_flight: int, ready,
                    results: multiprocessing.Queue) -> None:
    results.put(asdict(asyncio.run(_route(addresses, first, sessions, sticky, in_flight, ready))))


def run_scale(addresses: Sequence[str], scale: Scale, sticky: int, in_flight: int) -> list[RouterRun]:
    """``scale.routers`` Router processes over the first ``scale.servers`` servers, sharing the sessions and the
    sticky calls; each one's figures."""
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(scale.routers), context.Queue()
    share, calls = scale.sessions // scale.routers, sticky // scale.routers
    servers = list(addresses[: scale.servers])
    processes = [
        context.Process(target=_router_process, daemon=True,
                        args=(servers, worker * share, share, calls, in_flight, ready, results))
        for worker in range(scale.routers)
    ]
    for process in processes:
        process.start()
    try:
        runs = [RouterRun(**results.get(timeout=1200)) for _ in processes]
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
    return runs


# -- report ---------------------------------------------------------------------------------------------------------

def _print_run(scale: Scale, runs: list[RouterRun]) -> None:
    for index, run in enumerate(runs):
        who = f"router {index + 1}/{len(runs)}" if len(runs) > 1 else "router"
        print(f"{scale.name:>13s} {who:>12s}: idle {1e3 * run.idle_cpu_per_s:6.1f} ms CPU/s | open "
              f"{run.open_calls:6d} calls {run.open_calls / run.open_wall_s:6.0f}/s {run.open_us:6.0f} us CPU/call | "
              f"sticky {run.sticky_calls:6d} calls {run.sticky_calls / run.sticky_wall_s:6.0f}/s "
              f"{run.sticky_us:6.0f} us CPU/call | RSS +{run.rss_gain / 2**20:6.1f} MiB, "
              f"{run.rss_gain / run.live_sessions:5.0f} B/session | live {run.live_sessions} | "
              f"{run.sticky_polls / run.sticky_wall_s:5.0f} polls/s, {run.sticky_polls / run.sticky_calls:.3f} a call",
              flush=True)


def _scale(text: str) -> Scale:
    servers, sessions = text.split("x")
    return Scale(int(servers), int(sessions))


def _ratios(runs: list[tuple[Scale, list[RouterRun]]], scales: Sequence[Scale], workers: Scale) -> list[str]:
    """The RATIO lines: the largest single-Router scale against the smallest run just before it, 100k live sessions
    against 10k (over the same servers), the worker Routers against the single Router run just before them."""
    last = {scale: (index, found) for index, (scale, found) in enumerate(runs)}
    at, (big,) = last[scales[-1]]
    small = runs[at - 1][1][0]  # the smallest scale, run just before
    name = f"{scales[-1].name}_over_{scales[0].name}"
    lines = [
        f"RATIO router_cpu_per_call_{name} {big.sticky_us / small.sticky_us:.2f} target 1.5",
        f"RATIO router_cpu_per_new_session_{name} {big.open_us / small.open_us:.2f} target 1.5",
    ]
    tenth = last.get(Scale(scales[-1].servers, scales[-1].sessions // 10))
    if scales[-1].sessions == 100_000 and tenth is not None:
        lines.append(f"RATIO router_memory_100k_over_10k {big.rss_gain / tenth[1][0].rss_gain:.2f} target 10")
    if workers in last:
        worker_us = statistics.mean(run.sticky_us for run in last[workers][1])
        lines.append(f"RATIO router_worker_cpu_per_call_{workers.routers}w_over_1 {worker_us / big.sticky_us:.2f} "
                     f"target 1.5")
        worker_polls = statistics.mean(run.sticky_polls / run.sticky_calls for run in last[workers][1])
        lines.append(f"RATIO router_worker_polls_per_call_{workers.routers}w {worker_polls:.3f} target 0")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4x200 and 16x1000, 2 worker Routers")
    parser.add_argument("--scales", default="", help="SERVERSxSESSIONS,... instead of the default grid (the first "
                        "is the baseline)")
    parser.add_argument("--in-flight", type=int, default=64, help="calls in flight per Router")
    parser.add_argument("--sticky-calls", type=int, default=0, help="sticky calls per run (default 10,000)")
    parser.add_argument("--workers", type=int, default=0, help="worker Routers of the last run (default 4; 1: none)")
    args = parser.parse_args()
    scales = tuple(map(_scale, args.scales.split(","))) if args.scales else QUICK if args.quick else FULL
    sticky = args.sticky_calls or (2_000 if args.quick else 10_000)
    workers = Scale(scales[-1].servers, scales[-1].sessions, args.workers or (2 if args.quick else 4))
    # the baseline before every other scale: the host's load drifts over minutes, and each ratio pairs a run with
    # the one just before it
    plan = [run for scale in scales[1:] for run in (scales[0], scale)] or [scales[0]]
    if workers.routers > 1:
        plan.append(workers)
    cores = len(os.sched_getaffinity(0))
    print(f"fake engine servers at zero latency, {SERVERS_PER_PROCESS} to a process; each Router {args.in_flight} "
          f"calls in flight, GRPO groups of {GROUP_SIZE} sharing a {PROMPT_IDS}-id prompt, 1 token a call, "
          f"{sticky} sticky calls a run (shared by the worker Routers); {scales[0].name} before each other scale; "
          f"{cores} cores shared by every process; host load average {os.getloadavg()[0]:.1f} at the start",
          flush=True)
    started = time.perf_counter()
    runs: list[tuple[Scale, list[RouterRun]]] = []
    fleet = FakeEngineConfig(vocab_size=VOCAB, max_running=256)
    with fake_servers(max(s.servers for s in scales), fleet, SERVERS_PER_PROCESS) as (addresses, _):
        print(f"{len(addresses)} servers up in {time.perf_counter() - started:.1f} s", flush=True)
        for scale in plan:
            runs.append((scale, run_scale(addresses, scale, sticky, args.in_flight)))
            _print_run(scale, runs[-1][1])
    print(f"all runs: {time.perf_counter() - started:.0f} s; host load average {os.getloadavg()[0]:.1f} at the end "
          f"(other work on the host raises CPU per call)")
    print("\n".join(_ratios(runs, scales, workers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
