"""Weight sync: SmolLM2-135M's every parameter (fp32) to 2 embedded engine servers, by each transfer.

Two `agentloop engine serve` processes (embedded, one torch thread each) on this machine; a Fleet over them
applies the whole checkpoint as the manager does mid-rollout (Pause(ABORT) -> transfer -> Resume) with each
transfer: ``stream`` (UpdateWeights: the bytes through gRPC, once per engine), ``path`` (one safetensors file
written where both engines read it, LoadWeights) and ``collective`` (one gloo broadcast from this process to both,
ReceiveWeights). Wall time per update and the generation pause it causes (Pause to Resume answered), medians of
REPEATS. The baseline, measured in the same run, is one in-memory copy of the same bytes: the floor on one machine.

Then the cost of an update to generations under way: 32 generations (16 per server) decode while one collective
update lands, either staged (no pause: received while decoding, swapped between two steps) or paused around it
(Pause(KEEP) -> transfer -> Resume, the tokens kept). Decode steps lost per generation = tokens the 32 decoded in
the WINDOW_S seconds before the update, less those of the WINDOW_S seconds from its start, over 32; the stall =
how much longer a generation's longest wait between two tokens was in the second window; medians of REPEATS.

The last lines are ``RATIO <name> <value> target <target>``; targets: path and collective within 10x of a copy,
the stream at least 1.2x slower than the best transfer (else a fast path does not pay), staged updates stalling
generations at most half as long as pausing, and losing no more decode steps than pausing (on a CPU machine the
bytes are received by the cores that decode: staging shortens the stall but cannot make the transfer free).

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import itertools

from agentloop_grpc.agent.weight_transfer import (
    CollectiveTransfer,
    PathTransfer,
    StreamTransfer,
    WeightTransfer,
)
from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import PauseMode
from agentloop_grpc.engine_adapters.checkpoint import read_checkpoint
from agentloop_grpc.launch.launcher import agentloop_command
from agentloop_grpc.router import Fleet
from agentloop_grpc.v1 import generation_pb2

REPEATS = 3
SERVERS = 2
GENERATIONS = 32
WINDOW_S = 6.0  # holds one update (about a second) with room on both sides
PROMPT = [1, 4093, 198, 10898, 253, 1837, 30, 2, 198, 1, 520, 9531, 198]  # a ChatML user turn of the default model
LISTENING = re.compile(r"listening on (\S+) ")


def start_servers() -> tuple[list[subprocess.Popen], list[str]]:
    args = [*agentloop_command(), "engine", "serve", "--port", "0",
            "--set", "threads=1", "--set", f"max_running={GENERATIONS // SERVERS}", "--set", "max_model_len=1024"]
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


@dataclass
class Window:
    """What GENERATIONS running generations did in WINDOW_S seconds."""

    tokens: int
    stall_s: float  # the longest time one generation waited between two tokens (median over the generations)


async def around(fleet: Fleet, update) -> tuple[Window, Window]:
    """The WINDOW_S seconds before ``update()`` and the WINDOW_S seconds from its start (adjacent windows: the same
    load on the machine)."""
    stamps: list[list[float]] = [[] for _ in range(GENERATIONS)]
    decoding = asyncio.Event()

    async def generation(endpoint, index: int) -> None:
        request = generation_pb2.GenerateRequest(
            request_id=f"window-{time.monotonic_ns()}-{index}", prompt_ids=PROMPT,
            sampling_params=generation_pb2.SamplingParams(max_new_tokens=900, ignore_eos=True, temperature=0),
        )
        async for message in endpoint.generate.Generate(request, timeout=300):
            if message.WhichOneof("response") == "chunk":
                stamps[index].extend([time.perf_counter()] * len(message.chunk.token_ids))
                if all(stamps):
                    decoding.set()

    def window(begin: float) -> Window:
        inside = [[t for t in own if begin <= t < begin + WINDOW_S] for own in stamps]
        stalls = [max((b - a for a, b in itertools.pairwise(own)), default=WINDOW_S) for own in inside]
        return Window(sum(len(own) for own in inside), statistics.median(stalls))

    endpoints = list(fleet.servers.values())
    tasks = [asyncio.ensure_future(generation(endpoints[i % SERVERS], i)) for i in range(GENERATIONS)]
    try:
        await asyncio.wait_for(decoding.wait(), 120)
        await asyncio.sleep(0.5)  # every generation is decoding
        quiet = time.perf_counter()
        await asyncio.sleep(WINDOW_S)
        begin = time.perf_counter()
        await update()
        await asyncio.sleep(max(0.0, begin + WINDOW_S - time.perf_counter()))
        return window(quiet), window(begin)
    finally:
        await fleet.abort_all()
        await asyncio.gather(*tasks, return_exceptions=True)


async def update_costs(fleet: Fleet, transfer: WeightTransfer, tensors, version: int) -> dict[str, tuple[float, float]]:
    """Per mode (staged, paused): (decode steps each generation loses to one update, the stall it adds), medians of
    REPEATS."""
    async def staged() -> None:
        (await transfer.push(fleet, tensors, next(versions))).raise_for_errors()

    async def paused() -> None:
        (await fleet.pause(PauseMode.KEEP)).raise_for_errors()
        try:
            (await transfer.push(fleet, tensors, next(versions))).raise_for_errors()
        finally:
            (await fleet.resume()).raise_for_errors()

    versions = iter(range(version + 1, version + 1000))
    costs: dict[str, list[tuple[float, float]]] = {"staged": [], "paused": []}
    for repeat in range(REPEATS):
        for name, update in (("staged", staged), ("paused", paused)):
            quiet, updated = await around(fleet, update)
            lost, stall = (quiet.tokens - updated.tokens) / GENERATIONS, updated.stall_s - quiet.stall_s
            costs[name].append((lost, stall))
            print(f"{name} repeat {repeat}: {updated.tokens} tokens in {WINDOW_S:.0f} s with the update, "
                  f"{quiet.tokens} in the {WINDOW_S:.0f} s before: {lost:.1f} decode steps lost per generation; "
                  f"longest wait for a token {updated.stall_s * 1e3:.0f} ms ({quiet.stall_s * 1e3:.0f} ms before)")
    return {name: (statistics.median(c[0] for c in runs), statistics.median(c[1] for c in runs))
            for name, runs in costs.items()}


async def main() -> None:
    folder = model_store.prepare()
    tensors, total = read_checkpoint(str(folder))
    print(f"checkpoint: {len(tensors)} tensors, {total / 1e6:.0f} MB")
    processes, addresses = start_servers()
    scratch = tempfile.TemporaryDirectory(prefix="weight-sync-")
    collective = CollectiveTransfer("127.0.0.1")
    transfers: dict[str, WeightTransfer] = {
        "stream": StreamTransfer(), "path": PathTransfer(Path(scratch.name)), "collective": collective,
    }
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
            costs = await update_costs(fleet, collective, tensors, version)
            for name, (lost, stall) in costs.items():
                print(f"{name}: {lost:.1f} decode steps lost per generation, {stall * 1e3:.0f} ms added stall")
            await collective.close(fleet)
    finally:
        scratch.cleanup()
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
    best = min(wall for wall, _ in results.values())
    print(f"RATIO weight_sync_stream_over_memcpy {results['stream'][0] / memcpy:.3g} target 0")
    print(f"RATIO weight_sync_path_over_memcpy {results['path'][0] / memcpy:.3g} target 10")
    print(f"RATIO weight_sync_collective_over_memcpy {results['collective'][0] / memcpy:.3g} target 10")
    print(f"RATIO weight_sync_stream_over_best {results['stream'][0] / best:.3g} target 1.2")
    (staged_lost, staged_stall), (paused_lost, paused_stall) = costs["staged"], costs["paused"]
    print(f"RATIO weight_sync_staged_over_paused_stall {staged_stall / max(paused_stall, 1e-9):.3g} target 0.5")
    print(f"RATIO weight_sync_staged_over_paused_steps_lost {staged_lost / max(paused_lost, 1e-9):.3g} target 1")


if __name__ == "__main__":
    asyncio.run(main())
