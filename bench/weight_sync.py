"""Weight sync: SmolLM2-135M's every parameter (fp32) to 2 embedded engine servers, by each transfer.

Two `agentloop engine serve` processes (embedded, one torch thread each) on this machine; a Fleet over them
applies the whole checkpoint as the manager does mid-rollout (Pause(ABORT) -> transfer -> Resume) with each
transfer: ``stream`` (UpdateWeights: the bytes through gRPC, once per engine) and ``path`` (one safetensors file
written where both engines read it, LoadWeights). Wall time per update and the generation pause it causes (Pause
to Resume answered), medians of REPEATS. The baseline, measured in the same run, is one in-memory copy of the same
bytes: the floor on one machine. The last lines are ``RATIO <name> <value> target <target>``; targets: the path
transfer within 10x of a copy, and the stream at least 1.2x slower than the best transfer (else a fast path
does not pay).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/weight_sync.py
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentloop_grpc.agent.weight_transfer import PathTransfer, StreamTransfer, WeightTransfer  # noqa: E402
from agentloop_grpc.common import model_store  # noqa: E402
from agentloop_grpc.common.types import PauseMode  # noqa: E402
from agentloop_grpc.engine_adapters.checkpoint import read_checkpoint  # noqa: E402
from agentloop_grpc.launch.launcher import agentloop_command  # noqa: E402
from agentloop_grpc.router import Fleet  # noqa: E402

REPEATS = 3
SERVERS = 2
LISTENING = re.compile(r"listening on (\S+) ")


def start_servers() -> tuple[list[subprocess.Popen], list[str]]:
    args = [*agentloop_command(), "engine", "serve", "--port", "0",
            "--set", "threads=1", "--set", "max_running=4", "--set", "max_model_len=1024"]
    processes = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for _ in range(SERVERS)]
    addresses = []
    for process in processes:
        line = process.stdout.readline()
        match = LISTENING.search(line)
        if match is None:
            raise RuntimeError(f"a server did not start: {line!r}")
        addresses.append(match.group(1))
    return processes, addresses


def memcpy_s(tensors) -> float:
    """One copy of every tensor's bytes into preallocated memory (the floor)."""
    sources = [np.frombuffer(t.data, dtype=np.uint8) for t in tensors]
    targets = [np.empty_like(s) for s in sources]
    start = time.perf_counter()
    for source, target in zip(sources, targets):
        np.copyto(target, source)
    return time.perf_counter() - start


async def update_s(fleet: Fleet, transfer: WeightTransfer, tensors, version: int) -> tuple[float, float]:
    """(wall time of the whole update, generation pause: Pause(ABORT) until Resume answered)."""
    start = time.perf_counter()
    (await fleet.pause(PauseMode.ABORT)).raise_for_errors()
    paused = time.perf_counter()
    (await transfer.push(fleet, tensors, version)).raise_for_errors()
    (await fleet.resume()).raise_for_errors()
    end = time.perf_counter()
    return end - start, end - paused


async def main() -> None:
    folder = model_store.prepare()
    tensors, total = read_checkpoint(str(folder))
    print(f"checkpoint: {len(tensors)} tensors, {total / 1e6:.0f} MB")
    processes, addresses = start_servers()
    scratch = tempfile.TemporaryDirectory(prefix="weight-sync-")
    transfers: dict[str, WeightTransfer] = {"stream": StreamTransfer(), "path": PathTransfer(Path(scratch.name))}
    results: dict[str, tuple[float, float]] = {}
    try:
        async with Fleet(addresses) as fleet:
            await fleet.wait_ready(SERVERS, timeout_s=300)
            memcpy = statistics.median(memcpy_s(tensors) for _ in range(REPEATS))
            print(f"memcpy: {memcpy * 1e3:.0f} ms")
            version = 0
            for name, transfer in transfers.items():
                runs = []
                for repeat in range(REPEATS + 1):  # the first warms page cache and allocations
                    version += 1
                    wall, pause = await update_s(fleet, transfer, tensors, version)
                    print(f"{name} repeat {repeat}: update {wall * 1e3:.0f} ms, generation paused {pause * 1e3:.0f} ms")
                    if repeat:
                        runs.append((wall, pause))
                results[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
                print(f"{name}: median update {results[name][0] * 1e3:.0f} ms, pause {results[name][1] * 1e3:.0f} ms")
    finally:
        scratch.cleanup()
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
    best = min(wall for wall, _ in results.values())
    print(f"RATIO weight_sync_stream_over_memcpy {results['stream'][0] / memcpy:.3g} target 0")
    print(f"RATIO weight_sync_path_over_memcpy {results['path'][0] / memcpy:.3g} target 10")
    print(f"RATIO weight_sync_stream_over_best {results['stream'][0] / best:.3g} target 1.2")


if __name__ == "__main__":
    asyncio.run(main())
