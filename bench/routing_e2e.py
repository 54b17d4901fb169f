"""Routing end to end on two embedded engines: make train's task rolled out with today's placement
(sticky_least_loaded) and the new one (cache_aware).

The task and every setting are examples/train.yaml's: one-step additions, GRPO groups of ``num_generations``,
the two embedded replicas ``make train`` launches (same engine flags, same launcher), the built-in tool server, the
same loop config; --steps steps' worth of prompts (``prompts_per_step`` each), sampled with a seed. The agent
loops run as a rollout worker runs them (one worker, every sample at once, each group's samples in a row); their
generator is a Router with the placement under test, wrapped to sum every generation's prompt tokens and cached
prompt tokens (GenerateResult), so prefill tokens are exact. Each run starts from flushed prefix caches; the
placements alternate, --repeats runs each; medians. The task's prompt is mostly the system prompt every group
shares (27 of its 29 blocks of 16 tokens, bench/traces/train_task.jsonl), so group affinity has little to save
here: bench/routing_replay.py measures the workloads where it has.

Usage: HF_HUB_OFFLINE=1 python bench/routing_e2e.py [--steps 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml

from agentloop_grpc.agent import AgentLoopWorker, LoopContext, LoopRegistry, Trajectory
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.dataset import read_rows, to_samples
from agentloop_grpc.rollout.run import start_tools
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.tools.client import GrpcToolClient

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("sticky_least_loaded", "cache_aware")


@dataclass
class Counting:
    """The loops' generator: the Router, with every generation's prompt and cached tokens summed."""

    router: Router
    prompt_tokens: int = 0
    cached_tokens: int = 0
    group_servers: dict[str, set[str]] = field(default_factory=dict)

    async def generate(self, call: GenerateCall) -> GenerateResult:
        result = await self.router.generate(call)
        self.prompt_tokens += result.prompt_tokens
        self.cached_tokens += result.cached_prompt_tokens
        self.group_servers.setdefault(call.group_id, set()).update(result.servers)
        return result

    def close_session(self, session_id: str) -> None:
        self.router.close_session(session_id)


@dataclass(frozen=True)
class Run:
    policy: str
    prefill_tokens: int
    hit_rate: float
    wall_s: float
    servers_per_group: float
    failed: int
    mean_reward: float


def train_config(steps: int) -> tuple[RolloutConfig, int]:
    """make train's config as a rollout's (its engines, tools, dataset and loop) and its group size."""
    document = yaml.safe_load((ROOT / "examples" / "train.yaml").read_text())
    grpo = document.pop("grpo")
    for key in ("compare_steps", "output_dir", "mode"):
        document.pop(key, None)
    document["dataset"]["arithmetic"]["count"] = steps * grpo["prompts_per_step"]
    document["loop"]["sampling"]["seed"] = 0
    document["samples_per_prompt"] = grpo["num_generations"]
    return RolloutConfig.model_validate(document), grpo["num_generations"]


async def run_once(config: RolloutConfig, addresses: list[str], tool_address: str, policy: str) -> Run:
    samples = to_samples(read_rows(config.dataset), config.dataset, config.samples_per_prompt)
    async with AsyncExitStack() as stack:
        # validated (model_copy(update=) is not: the Router compares placements as enum members)
        router_config = RouterConfig.model_validate({**config.router.model_dump(), "placement": policy})
        router = await stack.enter_async_context(Router(addresses, router_config))
        await router.fleet.wait_ready(min_servers=len(addresses), timeout_s=300)
        (await router.fleet.flush_cache()).raise_for_errors()
        tools = GrpcToolClient(tool_address)
        stack.push_async_callback(tools.close)
        counting = Counting(router)
        context = LoopContext(
            generator=counting, codec=load_codec(None, config.loop), config=config.loop, tools=tools,
            tool_specs={s.name: s for s in await tools.list_tools()},
            **({"reward": config.reward_function.load()} if config.reward_function is not None else {}),
        )
        worker = AgentLoopWorker(LoopRegistry.default(context), config.max_concurrency)
        started = time.perf_counter()
        trajectories: list[Trajectory] = await worker.run(samples)
        wall = time.perf_counter() - started
    prompt = counting.prompt_tokens
    return Run(
        policy=policy,
        prefill_tokens=prompt - counting.cached_tokens,
        hit_rate=counting.cached_tokens / prompt if prompt else 0.0,
        wall_s=wall,
        servers_per_group=statistics.mean(len(s) for s in counting.group_servers.values()),
        failed=sum(t.failed for t in trajectories),
        mean_reward=statistics.mean(t.reward for t in trajectories),
    )


async def measure(steps: int, repeats: int) -> tuple[dict[str, list[Run]], int, int]:
    config, group = train_config(steps)
    launch = config.engines.launch
    assert launch is not None  # train.yaml launches its replicas
    runs: dict[str, list[Run]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory() as logs:
        async with AsyncExitStack() as stack:
            launcher = EngineLauncher(EngineLaunch(engine=launch.engine, dp=launch.replicas,
                                                   extra_args=launch.extra_args,
                                                   startup_timeout_s=launch.startup_timeout_s), Path(logs),
                                      terminate_with_parent=True)
            await stack.enter_async_context(launcher)
            tool_address = await start_tools(config.tools, stack, Path(logs))
            assert tool_address is not None  # train.yaml launches the built-in tools
            warm = config.model_copy(update={"dataset": config.dataset.model_copy(update={
                "arithmetic": config.dataset.arithmetic.model_copy(update={"count": 2, "seed": 99})})})
            await run_once(warm, launcher.addresses, tool_address, POLICIES[0])  # torch and grammar warm-up
            for repeat in range(repeats):
                for policy in POLICIES if repeat % 2 == 0 else POLICIES[::-1]:
                    run = await run_once(config, launcher.addresses, tool_address, policy)
                    runs[policy].append(run)
                    print(f"repeat {repeat + 1} {policy:20s} prefill {run.prefill_tokens:6d} tokens  hit "
                          f"{run.hit_rate:.3f}  wall {run.wall_s:5.1f} s  servers/group {run.servers_per_group:.1f}  "
                          f"failed {run.failed}  mean reward {run.mean_reward:.2f}", flush=True)
    return runs, len(to_samples(read_rows(config.dataset), config.dataset, config.samples_per_prompt)), group


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="Steps' worth of make train's prompts.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs, count, group = asyncio.run(measure(args.steps, args.repeats))
    median = {p: {name: statistics.median(getattr(r, name) for r in rs)
                  for name in ("prefill_tokens", "hit_rate", "wall_s", "servers_per_group")}
              for p, rs in runs.items()}
    print(f"\nmedians of {args.repeats}: {count} trajectories (GRPO groups of {group}), 2 embedded engines")
    for p, m in median.items():
        print(f"{p:20s} prefill {m['prefill_tokens']:8.0f} tokens  hit {m['hit_rate']:.3f}  wall {m['wall_s']:6.1f} s  "
              f"servers/group {m['servers_per_group']:.1f}")
    old, new = median["sticky_least_loaded"], median["cache_aware"]
    print(f"RATIO routing_e2e_prefill_tokens_over_sticky {new['prefill_tokens'] / old['prefill_tokens']:.3f} target 0")
    print(f"RATIO routing_e2e_wall_over_sticky {new['wall_s'] / old['wall_s']:.3f} target 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
