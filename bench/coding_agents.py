"""What coding harnesses cost: the sandbox, many CLIs at once, and the gateway's work per turn of a long session.

1. Sandbox create + destroy: a workspace made from a generated task's repository, `true` run in it, the workspace
   closed (every process killed, the folder removed), N_SANDBOX times, p50/p99; the baseline, measured in the same
   rounds, is what a harness without a sandbox would do (copy the repository, run `true` as a plain subprocess,
   remove the copy). RATIO sandbox_over_plain_p50 (target <= 10: the sandbox must not dominate a trajectory).
2. Concurrent harness trajectories: `agentloop rollout` (in this process) with the Codex CLI (``--harness``) on
   N_TRAJECTORIES generated tasks at once over the scripted fake engine (each CLI fixes its task in one call, then
   answers): wall time, and how many trajectories came back rewarded (none may be lost).
   RATIO harness_trajectories_complete (target 1.0).
3. The gateway's CPU per turn of a 20k-token conversation: Claude Code's first request (tests/gateway/client_bodies)
   as turn 1, then TURNS turns each appending a tool result, through the gateway in this process over a fake engine
   server in another process (zero latency, 16 tokens a turn): this process's CPU seconds per turn. A session's
   context is kept as token ids and each turn encodes only its delta, so a later turn must cost a fraction of the
   first (which renders and encodes all 20k tokens). RATIO gateway_cpu_later_turn_over_first (target <= 0.25).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/coding_agents.py [--sandboxes 40] [--trajectories 32] [--turns 8]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentloop_grpc.harness.generated_tasks import generate_tasks  # noqa: E402
from agentloop_grpc.harness.task import CONTAINER_FILES, CodingTask  # noqa: E402
from agentloop_grpc.harness.workspace import Workspace  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def sandboxes(count: int, work: Path) -> None:
    task = CodingTask.load(generate_tasks(work / "tasks", 1)[0])
    assert task.repo is not None
    sandboxed, plain = [], []
    for i in range(count):
        for kind in (("sandbox", "plain") if i % 2 == 0 else ("plain", "sandbox")):
            started = time.perf_counter()
            if kind == "sandbox":
                async with await Workspace.create(work / "ws", task.repo, leave_out=CONTAINER_FILES) as ws:
                    result = await ws.run(["true"])
                    assert result.ok, result
                sandboxed.append(time.perf_counter() - started)
            else:
                copy = work / f"plain-{i}"
                await asyncio.to_thread(shutil.copytree, task.repo, copy,
                                        ignore=shutil.ignore_patterns(*CONTAINER_FILES))
                process = await asyncio.create_subprocess_exec("true", cwd=copy)
                assert await process.wait() == 0
                await asyncio.to_thread(shutil.rmtree, copy)
                plain.append(time.perf_counter() - started)
    print(f"sandbox create+run+destroy: p50 {1000 * statistics.median(sandboxed):.1f} ms, "
          f"p99 {1000 * percentile(sandboxed, 0.99):.1f} ms ({count} runs)")
    print(f"plain copy+run+remove:      p50 {1000 * statistics.median(plain):.1f} ms, "
          f"p99 {1000 * percentile(plain, 0.99):.1f} ms")
    print(f"RATIO sandbox_over_plain_p50 {statistics.median(sandboxed) / statistics.median(plain):.2f} target 10")


async def trajectories(count: int, harness: str, work: Path) -> None:
    from rich.console import Console

    from agentloop_grpc.agent.spec import load_codec
    from agentloop_grpc.rollout.config import RolloutConfig
    from agentloop_grpc.rollout.progress import Progress
    from agentloop_grpc.rollout.run import RunRecord, run_rollout
    from tests.agent.conftest import TextScript, scripted_engine
    from tests.harness.test_harness_rollout import reply

    codec = load_codec(None)
    async with scripted_engine(TextScript(codec, reply), max_model_len=65536, max_running=256) as address:
        out = work / "rollout"
        config = RolloutConfig.model_validate({
            "engines": {"addresses": [address]}, "tools": {"launch": None},
            "dataset": {"coding_tasks": {"generated": min(count, 40)}},
            "samples_per_prompt": max(1, -(-count // 40)),
            "agent": {"harness": harness, "max_concurrency": count, "timeout_s": 900,
                      "workspace": {"root": str(work / "workspaces"), "wall_timeout_s": 600}},
            "output_dir": str(out), "report": False, "trace": False})
        record = RunRecord(output_dir=out)
        started = time.perf_counter()
        await run_rollout(config, Progress(Console(file=io.StringIO())), record)
        seconds = time.perf_counter() - started
    done = [t for t in record.trajectories if not t.failed]
    causes = sorted({t.infrastructure_cause or t.error or "" for t in record.trajectories if t.failed})
    failed = f"; failed: {causes}" if causes else ""
    print(f"{harness}: {len(record.trajectories)} trajectories at once, {len(done)} complete in {seconds:.1f} s "
          f"({seconds / max(len(record.trajectories), 1):.2f} s each on average){failed}")
    print(f"RATIO harness_trajectories_complete {len(done) / len(record.trajectories):.3f} target 1.0")


async def gateway_cpu(turns: int, work: Path) -> None:
    import httpx

    from agentloop_grpc.agent.spec import load_codec
    from agentloop_grpc.gateway.app import create_app
    from agentloop_grpc.gateway.server import serve_app
    from agentloop_grpc.gateway.service import SessionGateway
    from agentloop_grpc.router import Router

    body = json.loads((ROOT / "tests/gateway/client_bodies/claude-code-2.1.332-turn1.json").read_text())["body"]
    body = {**body, "stream": False, "max_tokens": 16}
    # the repository's guide file Claude Code would read in: a ~20k-token first prompt, as its real one measured
    guide = "".join(f"- rule {i}: keep functions small and name them for what they do.\n" for i in range(520))
    first = body["messages"][0]
    body["messages"] = [{**first, "content": [*first["content"], {"type": "text", "text": guide}]},
                        *body["messages"][1:]]
    log = work / "engine.log"
    with log.open("w") as out:
        engine = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentloop_grpc.cli", "engine", "serve", "--adapter", "fake", "--set",
            "vocab_size=49152", "--set", "max_model_len=65536", "--port", "0", start_new_session=True, stdout=out,
            stderr=subprocess.STDOUT)
    try:
        while not (found := re.search(r"listening on (\S+)", log.read_text())):
            if engine.returncode is not None:
                raise RuntimeError(f"the fake engine server ended: {log.read_text()}")
            await asyncio.sleep(0.1)
        address = found.group(1)
        codec = load_codec(None)
        async with Router([address]) as router:
            await router.fleet.wait_ready()
            gateway = SessionGateway(router, codec)
            async with serve_app(create_app(gateway)) as url, httpx.AsyncClient(base_url=url, timeout=120) as http:
                messages = list(body["messages"])
                cpu = []
                for turn in range(turns + 1):
                    started = time.process_time()
                    reply = await http.post("/sessions/long/v1/messages", json={**body, "messages": messages})
                    cpu.append(time.process_time() - started)
                    assert reply.status_code == 200, reply.text
                    content = reply.json()["content"]
                    messages += [{"role": "assistant", "content": content or [{"type": "text", "text": "ok"}]},
                                 {"role": "user", "content": f"Tool output {turn}: done."}]
                session = gateway.sessions.get("long")
                tokens = len(session.chains[0].builder.context_ids)
                forks = len(session.forks)
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        await asyncio.wait_for(engine.wait(), 30)
    later = statistics.median(cpu[1:])
    print(f"gateway CPU: turn 1 (a {tokens}-token context by the end) {1000 * cpu[0]:.1f} ms, later turns median "
          f"{1000 * later:.1f} ms ({turns} turns, {forks} forks)")
    print(f"RATIO gateway_cpu_later_turn_over_first {later / cpu[0]:.3f} target 0.25")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=40)
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--harness", default="codex")
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-coding-") as folder:
        work = Path(folder)
        await sandboxes(args.sandboxes, work)
        await gateway_cpu(args.turns, work)
        await trajectories(args.trajectories, args.harness, work)


if __name__ == "__main__":
    asyncio.run(main())
