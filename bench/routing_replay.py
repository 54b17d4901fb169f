"""Routing policies replayed at scale: agent traces against many fake engines with a prefill/decode cost model.

Replay: each trajectory of a routing trace (``routing_trace.jsonl``, docs/rollout.md) is played through the real
Router. Its first prompt is rebuilt from its block hashes (ids drawn per hash, so what real prompts shared the
rebuilt ones share: a GRPO group all of it, a system prompt its leading blocks); then each turn: wait the
recorded tool time (times --tool-scale), append synthetic tool tokens of the recorded length, and generate the
recorded length (``ignore_eos``, sampled with the sample's own seed). The next turn's prompt is the previous
prompt, the engine's tokens and the tool tokens, as in an agent loop; a trajectory ends with
``Router.close_session``. A GRPO group's samples start together, back to back as AgentLoopWorker starts them
(--group-stagger-s spaces them); at most --concurrent-groups groups run at once. The fake shares no prefill between
requests it admits in one step (vLLM caches a block as it allocates it and SGLang holds back a request whose prefix
another in the batch computes, so both do share), which understates what placing a group together saves on its
first turn.

Servers: --servers fake engine servers in one process of their own (as engines run on devices of their own). Cost
model: every decode step takes ``token_latency_s``; a step in which requests are prefilled also takes
``prefill_latency_s_per_token`` per prompt token not found in the prefix cache (it stalls the server's batch, as an
unchunked prefill does); at most ``max_running`` requests decode at once; the prefix cache holds ``cache_blocks``
blocks of 16 tokens (LRU). A server stands for an eighth of an H100 serving an 8B model to 128 sequences (16 of
them; 50k tokens of its ~400k of KV cache; an eighth of its ~30k prefill tokens/s), time compressed 2.5x: 10 ms
decode steps (25 ms), 100 us per uncached prompt token (270 us), tool times halved. What it costs in Python CPU
(the replay's and the servers') is printed beside the wall time: it must stay small against it.

Policies: every ``RouterConfig.placement`` (one Router each, every server's cache flushed before each), in an
order rotated per repeat. Per policy: prefill tokens (prompt tokens minus ``cached_prompt_tokens``, over every
generation), prefix hit rate, p50/p90 trajectory latency (start to last token), wall time, and the servers a GRPO
group's samples were spread over. Medians over --repeats. The RATIO lines compare with today's policy
(sticky_least_loaded); the anchors' lines (target 0): round_robin and least_loaded place every request afresh, so
they show what losing the multi-turn prefix hits costs (SkyRL #1791 measured 1.84x the p90 latency, prime-rl #3255
about 4x the generation time); consistent_hash keeps a session on one server but ignores load.

Workloads: by default the synthetic agentic trace (``synthesize``: GRPO groups of 8, multi-turn with tools, a
system prompt shared by all, a long task prompt per group; its shape in ``SHAPE``, fitted to nothing but written
down); ``--trace FILE`` replays a rollout's trace (bench/traces/train_task.jsonl: make train's task, recorded on two
embedded engines) with its groups repeated to --groups.

Usage: python bench/routing_replay.py [--quick] [--trace FILE] [--repeats 3] [--policies cache_aware,...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fake_fleet import fake_servers

from agentloop_grpc.agent.routing_trace import (
    BLOCK_SIZE,
    TraceRecord,
    TraceTurn,
    block_ids,
    prompt_blocks,
    read_routing_trace,
    stream_ids,
)
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.router import GenerateCall, Router, RouterConfig
from agentloop_grpc.router.config import Placement

HERE = Path(__file__).resolve().parent
BASELINE = "sticky_least_loaded"
NEW = "cache_aware"
VOCAB = 32_000
#: The trace's shape: token counts are drawn log-normally around the median, clipped to [low, high].
SHAPE = {
    "system_tokens": 1024,                 # tools and instructions: one system prompt for the whole dataset
    "task_tokens": (3072, 1024, 8192),     # the task (an issue and the files it names): one per GRPO group
    "turns": (2, 6),                       # assistant turns, uniform
    "generated": (64, 16, 256),            # tokens per assistant turn
    "tool_tokens": (384, 32, 2048),        # tool output appended before the next turn
    "tool_s": (1.0, 0.1, 6.0),             # seconds of a tool round
}


@dataclass(frozen=True, slots=True)
class Setup:
    servers: int
    groups: int
    group_size: int
    concurrent_groups: int
    token_latency_s: float
    prefill_s_per_token: float
    max_running: int
    cache_blocks: int
    tool_scale: float
    repeats: int
    #: Seconds between the starts of a group's samples.
    group_stagger_s: float = 0.0

    def engine(self) -> FakeEngineConfig:
        return FakeEngineConfig(
            vocab_size=VOCAB, token_latency_s=self.token_latency_s,
            prefill_latency_s_per_token=self.prefill_s_per_token, max_running=self.max_running,
            cache_blocks=self.cache_blocks, max_model_len=32_768, max_waiting=100_000,
        )


FULL = Setup(servers=16, groups=24, group_size=8, concurrent_groups=24, token_latency_s=0.01,
             prefill_s_per_token=1e-4, max_running=16, cache_blocks=3072, tool_scale=0.5, repeats=3)
QUICK = replace(FULL, servers=8, groups=8, concurrent_groups=8, repeats=1)


# -- workloads ------------------------------------------------------------------------------------------------------

def _draw(rng: random.Random, spec: tuple[float, float, float]) -> float:
    median, low, high = spec
    return min(high, max(low, rng.lognormvariate(0.0, 0.6) * median))


def synthesize(groups: int, group_size: int, seed: int = 0, shape: dict = SHAPE) -> list[TraceRecord]:
    """A routing trace of ``groups`` GRPO groups of ``group_size``: one system prompt for all, a task prompt per
    group, then each sample's own turns (see SHAPE)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, VOCAB) for _ in range(shape["system_tokens"])]
    records = []
    for g in range(groups):
        task = [rng.randrange(3, VOCAB) for _ in range(int(_draw(rng, shape["task_tokens"])))]
        blocks = tuple(prompt_blocks(system + task, BLOCK_SIZE))
        for s in range(group_size):
            turns = []
            for k in range(rng.randint(*shape["turns"])):
                context, wait = (0, 0.0) if k == 0 else (int(_draw(rng, shape["tool_tokens"])),
                                                         round(_draw(rng, shape["tool_s"]), 3))
                turns.append(TraceTurn(context, wait, (wait,) if k else (), int(_draw(rng, shape["generated"])), None))
            records.append(TraceRecord(
                sample_id=f"g{g}/{s}", group_id=f"g{g}", loop="tool", termination="stop", start_s=0.0, total_s=0.0,
                prompt_tokens=len(system) + len(task), block_size=BLOCK_SIZE, prompt_blocks=blocks,
                turns=tuple(turns), end_s=0.0,
            ))
    return records


def repeat_groups(records: Sequence[TraceRecord], groups: int) -> list[TraceRecord]:
    """``records``' groups cycled to ``groups`` groups (the copies are new groups: their ids get a suffix, their
    prompts stay the same, as a dataset's prompts come back each epoch)."""
    by_group: dict[str, list[TraceRecord]] = {}
    for r in records:
        by_group.setdefault(r.group_id, []).append(r)
    names = list(by_group)
    out = []
    for g in range(groups):
        name = names[g % len(names)]
        out += [replace(r, group_id=f"{name}#{g}", sample_id=f"{r.sample_id}#{g}") for r in by_group[name]]
    return out


def describe(records: Sequence[TraceRecord]) -> str:
    groups = {r.group_id for r in records}
    turns = [t for r in records for t in r.turns]
    prompt = statistics.median(r.prompt_tokens for r in records)
    return (f"{len(records)} trajectories in {len(groups)} groups; prompt median {prompt:.0f} tokens; "
            f"{len(turns) / len(records):.1f} turns each; generated median "
            f"{statistics.median(t.generated_tokens for t in turns):.0f}, tool tokens median "
            f"{statistics.median([t.context_tokens for t in turns if t.context_tokens] or [0]):.0f} a turn")


# -- servers --------------------------------------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- replay ---------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    first_server: str


@dataclass
class PolicyRun:
    policy: str
    outcomes: list[Outcome] = field(default_factory=list)
    groups: dict[str, set[str]] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    #: The machine's 1-minute load average at the end (above its cores: other work stretched the latencies).
    load: float = 0.0

    @property
    def prefill_tokens(self) -> int:
        return sum(o.prompt_tokens - o.cached_tokens for o in self.outcomes)

    @property
    def hit_rate(self) -> float:
        prompt = sum(o.prompt_tokens for o in self.outcomes)
        return sum(o.cached_tokens for o in self.outcomes) / prompt if prompt else 0.0

    def latency(self, q: float) -> float:
        values = sorted(o.latency_s for o in self.outcomes)
        return values[min(len(values) - 1, int(q * len(values)))]

    @property
    def servers_per_group(self) -> float:
        return statistics.mean(len(s) for s in self.groups.values())


class Prompts:
    """Rebuilt prompts: ids per block hash, kept (a group's samples and later groups of one prompt share them)."""

    def __init__(self) -> None:
        self._blocks: dict[str, bytes] = {}

    def first(self, record: TraceRecord) -> array:
        ids = array("i")
        for i, block in enumerate(record.prompt_blocks):
            if block not in self._blocks:
                length = min(record.block_size, record.prompt_tokens - i * record.block_size)
                self._blocks[block] = array("i", block_ids(block, length, VOCAB)).tobytes()
            ids.frombytes(self._blocks[block])
        return ids


async def _trajectory(router: Router, record: TraceRecord, prompts: Prompts, tag: str, delay_s: float,
                      tool_scale: float, run: PolicyRun) -> None:
    await asyncio.sleep(delay_s)
    session, group = f"{tag}/{record.sample_id}", f"{tag}/{record.group_id}"
    seed = zlib.crc32(record.sample_id.encode())
    prompt = prompts.first(record)
    prompt_tokens = cached = 0
    first_server = ""
    started = time.perf_counter()
    for k, turn in enumerate(record.turns):
        wait = turn.wait_s if turn.wait_s is not None else sum(turn.tool_s)
        if k and wait:
            await asyncio.sleep(wait * tool_scale)
        if turn.context_tokens:
            prompt.extend(stream_ids(seed * 1000 + k, turn.context_tokens, VOCAB))
        sampling = SamplingParams(max_new_tokens=max(1, turn.generated_tokens), ignore_eos=True, seed=seed + k)
        result = await router.generate(GenerateCall(session, prompt[:], sampling, group_id=group))
        prompt_tokens += result.prompt_tokens
        cached += result.cached_prompt_tokens
        first_server = first_server or result.servers[0]
        run.groups.setdefault(record.group_id, set()).update(result.servers)
        prompt.extend(result.token_ids)
    router.close_session(session)
    run.outcomes.append(Outcome(time.perf_counter() - started, prompt_tokens, cached, first_server))


async def replay_policy(addresses: list[str], policy: str, records: Sequence[TraceRecord], setup: Setup,
                        prompts: Prompts, tag: str, server_pid: int) -> PolicyRun:
    run = PolicyRun(policy)
    groups: dict[str, list[TraceRecord]] = {}
    for r in sorted(records, key=lambda r: r.start_s):
        groups.setdefault(r.group_id, []).append(r)
    slots = asyncio.Semaphore(setup.concurrent_groups)

    async with Router(addresses, RouterConfig(placement=policy)) as router:
        await router.fleet.wait_ready(min_servers=len(addresses), timeout_s=60)
        (await router.fleet.flush_cache()).raise_for_errors()

        async def group(members: list[TraceRecord]) -> None:
            async with slots:
                await asyncio.gather(*(
                    _trajectory(router, r, prompts, tag, i * setup.group_stagger_s, setup.tool_scale, run)
                    for i, r in enumerate(members)
                ))

        cpu, server_cpu, started = time.process_time(), cpu_s(server_pid), time.perf_counter()
        await asyncio.gather(*(group(members) for members in groups.values()))
        run.wall_s = time.perf_counter() - started
        run.cpu_s, run.server_cpu_s = time.process_time() - cpu, cpu_s(server_pid) - server_cpu
        run.load = os.getloadavg()[0]
    return run


def _policies(names: str) -> list[str]:
    known = [p.value for p in Placement]
    wanted = [n for n in names.split(",") if n] or known
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; RouterConfig.placement takes {known}")
    return wanted


async def measure(records: Sequence[TraceRecord], setup: Setup, policies: list[str]) -> dict[str, list[PolicyRun]]:
    runs: dict[str, list[PolicyRun]] = {p: [] for p in policies}
    prompts = Prompts()
    with fake_servers(setup.servers, setup.engine()) as (addresses, (pid,)):
        for repeat in range(setup.repeats):
            order = policies[repeat % len(policies):] + policies[: repeat % len(policies)]
            for policy in order:
                run = await replay_policy(addresses, policy, records, setup, prompts, f"{policy}{repeat}", pid)
                runs[policy].append(run)
                print(f"repeat {repeat + 1} {policy:20s} prefill {run.prefill_tokens:>10,d}  hit {run.hit_rate:.3f}  "
                      f"p90 {run.latency(0.9):6.2f} s  wall {run.wall_s:6.1f} s  servers/group "
                      f"{run.servers_per_group:4.1f}  cpu: replay {run.cpu_s:4.1f} s, servers "
                      f"{run.server_cpu_s:4.1f} s  load {run.load:.1f}", flush=True)
    return runs


def report(runs: dict[str, list[PolicyRun]], setup: Setup) -> None:
    def median(policy: str, figure) -> float:
        return statistics.median(figure(run) for run in runs[policy])

    figures = {
        p: {
            "prefill": median(p, lambda r: r.prefill_tokens),
            "hit": median(p, lambda r: r.hit_rate),
            "p50": median(p, lambda r: r.latency(0.5)),
            "p90": median(p, lambda r: r.latency(0.9)),
            "wall": median(p, lambda r: r.wall_s),
            "spread": median(p, lambda r: r.servers_per_group),
        }
        for p in runs
    }
    print(f"\nmedians of {setup.repeats} on {os.cpu_count()} cores: {setup.servers} fake servers (step "
          f"{setup.token_latency_s * 1e3:g} ms, prefill {setup.prefill_s_per_token * 1e6:g} us/token, max_running "
          f"{setup.max_running}, cache {setup.cache_blocks} blocks of {BLOCK_SIZE}), {setup.concurrent_groups} "
          f"groups at once, a group's samples {setup.group_stagger_s * 1e3:g} ms apart")
    print(f"{'policy':20s} {'prefill tokens':>14s} {'hit rate':>8s} {'p50 s':>7s} {'p90 s':>7s} {'wall s':>7s} "
          f"{'servers/group':>13s}")
    for p, f in figures.items():
        print(f"{p:20s} {f['prefill']:>14,.0f} {f['hit']:>8.3f} {f['p50']:>7.2f} {f['p90']:>7.2f} {f['wall']:>7.1f} "
              f"{f['spread']:>13.1f}")
    if BASELINE not in figures:
        return
    base = figures[BASELINE]
    if NEW in figures:
        print(f"RATIO routing_prefill_tokens_over_sticky {figures[NEW]['prefill'] / base['prefill']:.3f} target 0.6")
        print(f"RATIO routing_p90_trajectory_latency_over_sticky {figures[NEW]['p90'] / base['p90']:.3f} target 0.8")
    for p in figures:  # the anchors: no target (0)
        if p not in (BASELINE, NEW):
            prefill = figures[p]["prefill"] / base["prefill"]
            print(f"RATIO routing_prefill_tokens_{p}_over_sticky {prefill:.3f} target 0")
            print(f"RATIO routing_p90_trajectory_latency_{p}_over_sticky {figures[p]['p90'] / base['p90']:.3f} "
                  "target 0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="A smoke run: 8 servers, 12 groups, one repeat.")
    parser.add_argument("--trace", type=Path, help="A routing_trace.jsonl to replay instead of the synthetic one.")
    parser.add_argument("--policies", default="", help="Comma-separated placements (default: every one).")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--servers", type=int)
    parser.add_argument("--groups", type=int)
    parser.add_argument("--concurrent-groups", type=int)
    parser.add_argument("--cache-blocks", type=int)
    parser.add_argument("--tool-scale", type=float, help="Multiply the trace's tool seconds by this.")
    parser.add_argument("--group-stagger-s", type=float,
                        help="Seconds between the starts of a group's samples (default 0).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup = QUICK if args.quick else FULL
    overrides = {name: getattr(args, name) for name in ("repeats", "servers", "groups", "concurrent_groups",
                                                        "cache_blocks", "tool_scale", "group_stagger_s")
                 if getattr(args, name) is not None}
    setup = replace(setup, **overrides)
    policies = _policies(args.policies)
    if args.trace:
        records = repeat_groups(read_routing_trace(args.trace), setup.groups)
        print(f"trace {args.trace}, its groups repeated to {setup.groups}")
    else:
        records = synthesize(setup.groups, setup.group_size, args.seed)
        print(f"synthetic agentic trace (seed {args.seed}, GRPO groups of {setup.group_size})")
    print(describe(records), flush=True)
    runs = asyncio.run(measure(records, setup, policies))
    report(runs, setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
