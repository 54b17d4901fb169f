"""Training, sync against fully-async: `agentloop train` on `make train`'s task, same config, seed and budget.

Each run is `agentloop train --config examples/train.yaml` (two embedded replicas, one thread each, the built-in
tool server, TRL's GRPOTrainer on SmolLM2-135M's top 8 layers, 3 prompts x 4 trajectories a step) with
`mode: sync` or `mode: async` (max_staleness 1), in its own output folder, stopped BUDGET_S seconds after its
first step began (start-up and model loads are the same for both and not counted). Runs alternate sync, async,
sync, async... so a drift of the machine hits both. Per run: steps finished within the budget, steps per hour,
the mean reward of the last LAST_STEPS steps reached (reward at budget), reward per step and per minute, and the
time split per step (rollout wait = trainer idle, train, weight push, engine idle).

RATIO lines compare the medians over rounds: `train_async_steps_per_hour_over_sync` and
`train_async_reward_at_budget_over_sync` (the reward at the budget is noisy at a dozen trajectories a step: read
it with the per-step table). Not in `make test`: a round takes 2 x BUDGET_S plus start-ups.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/train_async.py [--budget-s 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
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
LAST_STEPS = 3


def run(mode: str, budget_s: float, folder: Path, max_staleness: int) -> dict:
    config = yaml.safe_load((ROOT / "examples" / "train.yaml").read_text())
    config.update(mode=mode, max_staleness=max_staleness, output_dir=str(folder / "out"), report_to=[])
    config["grpo"]["max_steps"] = 10_000  # the budget stops the run
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GOMP_SPINCOUNT": "10000"}
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", "train", "--config", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    lines: list[tuple[float, str]] = []
    started: list[float] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.monotonic(), line.rstrip()))
            if line.startswith("training:") and not started:
                started.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not started and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
        if not started:
            raise RuntimeError(f"{mode}: training never started:\n" + "\n".join(t for _, t in lines[-30:]))
        while time.monotonic() < started[0] + budget_s and process.poll() is None:
            time.sleep(0.5)
    finally:
        _stop(process)
        reader.join(timeout=10)
    finished = [at for at, text in lines if text.startswith("step ") and at <= started[0] + budget_s]
    metrics = folder / "out" / "metrics.jsonl"
    steps = [json.loads(s) for s in metrics.read_text().splitlines()][:len(finished)] if metrics.exists() else []
    if not steps:
        raise RuntimeError(f"{mode}: no step within {budget_s:.0f} s:\n" + "\n".join(t for _, t in lines[-30:]))
    rewards = [s["reward_mean"] for s in steps]
    return {
        "mode": mode,
        "steps": len(steps),
        "steps_per_hour": len(steps) / budget_s * 3600,
        "reward_at_budget": statistics.fmean(rewards[-LAST_STEPS:]),
        "reward_per_minute": sum(rewards) / (budget_s / 60),
        "rewards": rewards,
        **{f"mean_{key}": statistics.fmean(s.get(key, 0.0) for s in steps)
           for key in ("rollout_s", "train_s", "weight_sync_s", "trainer_idle_s", "engine_idle_s")},
        "staleness_max": max(s.get("staleness_max", 0.0) for s in steps),
    }


def _stop(process: subprocess.Popen) -> None:
    """Stop the run as Ctrl-C does (it stops the servers it launched), else SIGKILL it: its servers stop with it
    (they are started to end with their run)."""
    for sig, wait_s in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-staleness", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="agentloop-train-async-") as scratch:
        for r in range(args.rounds):
            for mode in ("sync", "async"):
                folder = Path(scratch) / f"{mode}-{r}"
                folder.mkdir()
                result = run(mode, args.budget_s, folder, args.max_staleness)
                results[mode].append(result)
                print(f"round {r + 1} {mode:5s}: {result['steps']} steps in {args.budget_s:.0f} s "
                      f"({result['steps_per_hour']:.0f}/h), reward at budget {result['reward_at_budget']:.3f}, "
                      f"per step: rollout wait {result['mean_rollout_s']:.1f} s, train {result['mean_train_s']:.1f} s, "
                      f"push {result['mean_weight_sync_s']:.2f} s, engines idle {result['mean_engine_idle_s']:.1f} s, "
                      f"staleness <= {result['staleness_max']:.0f}; rewards {[round(x, 2) for x in result['rewards']]}",
                      flush=True)
    median = {mode: {key: statistics.median(r[key] for r in runs) for key in
                     ("steps_per_hour", "reward_at_budget", "reward_per_minute", "mean_rollout_s", "mean_train_s",
                      "mean_weight_sync_s", "mean_trainer_idle_s", "mean_engine_idle_s")}
              for mode, runs in results.items()}
    print(f"\nmedians over {args.rounds} round(s), {args.budget_s:.0f} s of training each:")
    print("mode   steps/h  reward@budget  reward/min  rollout-wait  train  push  trainer-idle  engine-idle")
    for mode, m in median.items():
        print(f"{mode:5s}  {m['steps_per_hour']:7.1f}  {m['reward_at_budget']:13.3f}  {m['reward_per_minute']:10.3f}  "
              f"{m['mean_rollout_s']:12.1f}  {m['mean_train_s']:5.1f}  {m['mean_weight_sync_s']:4.2f}  "
              f"{m['mean_trainer_idle_s']:12.1f}  {m['mean_engine_idle_s']:11.1f}")
    sync, asyn = median["sync"], median["async"]
    print(f"RATIO train_async_steps_per_hour_over_sync {asyn['steps_per_hour'] / sync['steps_per_hour']:.2f} "
          "target 1.3")
    reward_ratio = asyn["reward_at_budget"] / sync["reward_at_budget"] if sync["reward_at_budget"] > 0 else float("nan")
    print(f"RATIO train_async_reward_at_budget_over_sync {reward_ratio:.2f} target 1.0")


if __name__ == "__main__":
    main()
