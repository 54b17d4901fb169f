"""Training, sync against fully-async: `agentloop train`, same config, seed and budget, in two placements.

- split (the regime async is for; `train_async_*` ratios): engines and trainer on their own cores, the same split
  in both modes. One embedded engine replica (1 thread, `agentloop engine launch`) and the tool server run under
  `taskset -c 0`; the trainer (`agentloop train`, torch_threads 1, with its agent-loop worker and Router) under
  `taskset -c 1`, reaching them through the discovery file and the tool server's address. The task: `make train`'s
  one-step additions with calculator and check_answer, 1 prompt x 4 trajectories a step (top 4 layers trained, no
  logprob check: PROMPTS_PER_STEP, TRAINABLE_LAYERS), but every tool call
  first waits a latency drawn from a lognormal distribution (median TOOL_MEDIAN_S, sigma TOOL_SIGMA, at most
  TOOL_MAX_S; `slow_tools.py`, seeded with the run's seed), as sandboxed tools and test runs do: a trajectory's
  time is its 1-3 turns' decoding plus its calls' latencies, and a step waits for its slowest trajectory.
- shared (`train_async_shared_cores_*` ratios): `make train`'s task and config as they are (`examples/train.yaml`:
  two embedded replicas and the trainer sharing both cores, no tool latency).

Each run is stopped BUDGET_S seconds after its first step began (start-up and model loads are the same for both
modes and not counted). Runs alternate sync, async, sync, async... so a drift of the machine hits both; the load
average is printed before and after each run (on a shared machine pinning keeps our processes apart, not others'
off our cores: `--nice -15` gives every process of a run, and its session's autogroup, a larger share; root only).
Per run: steps finished within the budget and steps per hour (finished steps over the time to the last
one, so a step cut by the budget does not count as nothing), the mean reward of the last LAST_STEPS steps reached
(reward at budget), the time split per step: rollout wait (the trainer idle), train, weight push, engine idle (no
group in flight; in sync: the train and push), and the CPU share each side used over the budget (trainer: its
process and children; servers: the engine replica and tool server; shared placement: the trainer's figure holds the
servers it launched).

RATIO lines compare the medians over rounds (the reward at the budget is noisy at a handful of steps of 8-12
trajectories: read it with the per-step rewards). Not in `make test`: a round takes 2 x BUDGET_S plus start-ups.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/train_async.py [--placement split|shared] [--budget-s 300] [--rounds 2]
        [--nice -15]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
LAST_STEPS = 3
ENGINE_CORES, TRAINER_CORES = "0", "1"
TOOL_MEDIAN_S, TOOL_SIGMA, TOOL_MAX_S = 6.0, 1.0, 40.0
SEED = 0
#: A smaller trainer step than make train's (3 prompts, 8 layers): on one core that one outlasts the rollout, and a
#: 300 s budget would hold one or two steps.
PROMPTS_PER_STEP, TRAINABLE_LAYERS = 1, 4
CLI = [sys.executable, "-m", "agentloop_grpc.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GOMP_SPINCOUNT": "10000"}


class Output:
    """A process's output lines, read on a thread, each with the monotonic time it arrived."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def first(self, prefix: str) -> tuple[float, str] | None:
        return next(((at, text) for at, text in self.lines if text.startswith(prefix)), None)

    def tail(self) -> str:
        return "\n".join(text for _, text in self.lines[-30:])

    def join(self) -> None:
        self._thread.join(timeout=10)


def start(command: list[str], cores: str | None, nice: int, env: dict | None = None) -> tuple[subprocess.Popen, Output]:
    """``command`` in its own process group (stopped whole), pinned to ``cores`` when given, at niceness ``nice``
    (below 0: it takes its cores back from the other users of a shared machine)."""
    pinned = ["taskset", "-c", cores, *command] if cores else command
    pinned = ["nice", "-n", str(nice), *pinned] if nice else pinned
    process = subprocess.Popen(pinned, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env or ENV, start_new_session=True)
    return process, Output(process)


def stop(process: subprocess.Popen, first: signal.Signals = signal.SIGINT) -> None:
    """Stop a process group with ``first`` (Ctrl-C: a run stops the servers it launched; SIGTERM: a launcher its
    servers), else SIGKILL it."""
    for sig, wait_s in ((first, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def wait_for(ready, process: subprocess.Popen, output: Output, what: str, timeout_s: float = 600.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        found = ready()
        if found:
            return found
        time.sleep(0.5)
    raise RuntimeError(f"{what} never became ready:\n{output.tail()}")


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks, user and system) of every live process, from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        found[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return found


def tree(root: int, processes: dict[int, tuple[int, int]]) -> set[int]:
    """``root`` and its live descendants (the servers a launcher starts have process groups of their own)."""
    members, grown = {root}, True
    while grown:
        found = {pid for pid, (ppid, _) in processes.items() if ppid in members} - members
        members |= found
        grown = bool(found)
    return members


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process and its live descendants."""
    processes = _processes()
    return sum(processes[pid][1] for pid in tree(root, processes) if pid in processes) / os.sysconf("SC_CLK_TCK")


def renice_tree(root: int, nice: int) -> None:
    """Give the autogroups of a process and its descendants niceness ``nice``: with the kernel's autogroups (each
    session one scheduling group, shared fairly), a process's own nice counts only within its session."""
    processes = _processes()
    for pid in tree(root, processes):
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def tools_yaml(folder: Path) -> Path:
    """The tool server's config: calculator and check_answer, each behind a seeded lognormal latency."""
    delay = {"seed": SEED, "median_s": TOOL_MEDIAN_S, "sigma": TOOL_SIGMA, "max_s": TOOL_MAX_S}
    config = {"tools": [{"class": "slow_tools:Delayed", "kwargs": {"tool": tool, **delay}} for tool in (
        "agentloop_grpc.tools.builtin.calculator:calculator", "agentloop_grpc.tools.builtin.check_answer:CheckAnswer")]}
    path = folder / "tools.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_split_servers(folder: Path, processes: list[subprocess.Popen], nice: int) -> dict:
    """The engine replica and the tool server on ENGINE_CORES; the train config's engines and tools sections."""
    tools, tools_out = start([*CLI, "tools", "serve", "--config", str(tools_yaml(folder)), "--port", "0"],
                             ENGINE_CORES, nice, {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [
                                 str(HERE), ENV.get("PYTHONPATH")]))})
    processes.append(tools)
    discovery = folder / "discovery.json"
    engines, engines_out = start([*CLI, "engine", "launch", "--dp", "1", "--adapter", "embedded",
                                  "--set", "threads=1", "--set", "max_running=16", "--set", "max_model_len=1024",
                                  "--discovery-file", str(discovery), "--log-dir", str(folder / "logs")],
                                 ENGINE_CORES, nice)
    processes.append(engines)
    listening = wait_for(lambda: next((x for x in tools_out.lines if "listening on" in x[1]), None), tools,
                         tools_out, "the tool server")
    address = listening[1].split("listening on", 1)[1].split()[0]
    wait_for(lambda: discovery.exists() and _servers(discovery), engines, engines_out, "the engine replica")
    return {"engines": {"discovery_file": str(discovery)}, "tools": {"address": address, "launch": None}}


def _servers(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text())["servers"])
    except (OSError, ValueError, KeyError):
        return False  # not written whole yet


def train_config(placement: str, mode: str, folder: Path, max_staleness: int, servers: dict) -> Path:
    config = yaml.safe_load((ROOT / "examples" / "train.yaml").read_text())
    config.update(mode=mode, max_staleness=max_staleness, output_dir=str(folder / "out"), report_to=[])
    config["grpo"]["max_steps"] = 10_000  # the budget stops the run
    if placement == "split":
        config.update(servers)
        config["grpo"].update(prompts_per_step=PROMPTS_PER_STEP, trainable_layers=TRAINABLE_LAYERS, torch_threads=1,
                              seed=SEED)
        config["check_logprobs"] = 0  # a diagnostic forward pass: the trainer's core is the scarce one here
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(placement: str, mode: str, budget_s: float, folder: Path, max_staleness: int, nice: int) -> dict:
    processes: list[subprocess.Popen] = []
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    began = time.monotonic()
    try:
        servers = start_split_servers(folder, processes, nice) if placement == "split" else {}
        config = train_config(placement, mode, folder, max_staleness, servers)
        trainer, out = start([*CLI, "train", "--config", str(config)],
                             TRAINER_CORES if placement == "split" else None, nice)
        processes.insert(0, trainer)  # stopped first: it must not see its servers go
        started = wait_for(lambda: out.first("training:"), trainer, out, f"{mode}: training")[0]
        if nice:
            for process in processes:
                renice_tree(process.pid, nice)
        cpu_before = [tree_cpu_s(p.pid) for p in processes]
        while time.monotonic() < started + budget_s and trainer.poll() is None:
            time.sleep(0.5)
        # CPU seconds over the budget: the trainer's, the servers' (engine replica, tool server)
        busy = [after - before for before, after in zip(cpu_before, (tree_cpu_s(p.pid) for p in processes),
                                                           strict=True)]
    finally:
        for process in processes:
            stop(process, signal.SIGINT if process is processes[0] else signal.SIGTERM)
    out.join()
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    finished = [at for at, text in out.lines if text.startswith("step ") and at <= started + budget_s]
    metrics = folder / "out" / "metrics.jsonl"
    steps = [json.loads(s) for s in metrics.read_text().splitlines()][:len(finished)] if metrics.exists() else []
    if not steps:
        raise RuntimeError(f"{mode}: no step within {budget_s:.0f} s:\n{out.tail()}")
    rewards = [s["reward_mean"] for s in steps]
    return {
        "mode": mode,
        "steps": len(steps),
        "steps_per_hour": len(steps) / (finished[len(steps) - 1] - started) * 3600,
        "reward_at_budget": statistics.fmean(rewards[-LAST_STEPS:]),
        "rewards": rewards,
        **{f"mean_{key}": statistics.fmean(s.get(key, 0.0) for s in steps)
           for key in ("rollout_s", "train_s", "weight_sync_s", "trainer_idle_s", "engine_idle_s")},
        "staleness_max": max(s.get("staleness_max", 0.0) for s in steps),
        "load": f"{' '.join(load_before)} -> {' '.join(load_after)}",
        "wall_s": time.monotonic() - began,
        "trainer_busy": busy[0] / budget_s,
        "servers_busy": sum(busy[1:]) / budget_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--placement", choices=("split", "shared"), default="split")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--nice", type=int, default=0, help="niceness of the runs' processes (root may go below 0)")
    args = parser.parse_args()
    if args.placement == "split":
        print(f"split: engine replica and tool server on core {ENGINE_CORES}, trainer on core {TRAINER_CORES}; tool "
              f"latency lognormal(median {TOOL_MEDIAN_S:g} s, sigma {TOOL_SIGMA:g}), at most {TOOL_MAX_S:g} s, seed "
              f"{SEED}; {PROMPTS_PER_STEP} prompts x 4 trajectories a step, top {TRAINABLE_LAYERS} layers trained",
              flush=True)
    if args.nice:
        print(f"every process of a run at nice {args.nice}", flush=True)
    if args.placement == "shared":
        print("shared: examples/train.yaml as is (2 replicas and the trainer on both cores, no tool latency)",
              flush=True)
    results: dict[str, list[dict]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="agentloop-train-async-") as scratch:
        for r in range(args.rounds):
            for mode in ("sync", "async"):
                folder = Path(scratch) / f"{mode}-{r}"
                folder.mkdir()
                result = run(args.placement, mode, args.budget_s, folder, args.max_staleness, args.nice)
                results[mode].append(result)
                print(f"round {r + 1} {mode:5s}: {result['steps']} steps in {args.budget_s:.0f} s "
                      f"({result['steps_per_hour']:.0f}/h), reward at budget {result['reward_at_budget']:.3f}, "
                      f"per step: rollout wait {result['mean_rollout_s']:.1f} s, train {result['mean_train_s']:.1f} s, "
                      f"push {result['mean_weight_sync_s']:.2f} s, engines idle {result['mean_engine_idle_s']:.1f} s, "
                      f"staleness <= {result['staleness_max']:.0f}; CPU busy: trainer {result['trainer_busy']:.0%}, "
                      f"servers {result['servers_busy']:.0%}; "
                      f"rewards {[round(x, 2) for x in result['rewards']]}; load {result['load']}, "
                      f"wall {result['wall_s']:.0f} s", flush=True)
    keys = ("steps_per_hour", "reward_at_budget", "mean_rollout_s", "mean_train_s", "mean_weight_sync_s",
            "mean_trainer_idle_s", "mean_engine_idle_s", "trainer_busy", "servers_busy")
    median = {mode: {key: statistics.median(r[key] for r in runs) for key in keys} for mode, runs in results.items()}
    print(f"\n{args.placement}: medians over {args.rounds} round(s), {args.budget_s:.0f} s of training each:")
    print("mode   steps/h  reward@budget  rollout-wait  train  push  trainer-idle  engine-idle  trainer-cpu  "
          "servers-cpu")
    for mode, m in median.items():
        print(f"{mode:5s}  {m['steps_per_hour']:7.1f}  {m['reward_at_budget']:13.3f}  {m['mean_rollout_s']:12.1f}  "
              f"{m['mean_train_s']:5.1f}  {m['mean_weight_sync_s']:4.2f}  {m['mean_trainer_idle_s']:12.1f}  "
              f"{m['mean_engine_idle_s']:11.1f}  {m['trainer_busy']:11.0%}  {m['servers_busy']:11.0%}")
    sync, asyn = median["sync"], median["async"]
    name = "train_async" if args.placement == "split" else "train_async_shared_cores"
    print(f"RATIO {name}_steps_per_hour_over_sync {asyn['steps_per_hour'] / sync['steps_per_hour']:.2f} target 1.5")
    reward_ratio = asyn["reward_at_budget"] / sync["reward_at_budget"] if sync["reward_at_budget"] > 0 else float("nan")
    print(f"RATIO {name}_reward_at_budget_over_sync {reward_ratio:.2f} target 1.0")


if __name__ == "__main__":
    main()
