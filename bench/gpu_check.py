"""The GPU check: the embedded engine on one device, end to end, in one command (about five minutes on a GPU).

Model: SmolLM2-135M's architecture (its config.json and tokenizer files, ``--model-files``) with random weights made
here (seed 0) and saved to a scratch folder the engines load: the text means nothing, the throughput and memory
figures are real. ``--device cpu`` shrinks everything (two layers of width 128, short runs) so `make test` keeps the
check from rotting on a machine without a GPU.

Parts, each recorded even when another fails:
1. throughput: the embedded engine in this process at each in-flight count (greedy, ignore_eos, the same budget
   per request): tokens/s and time to first token, then transformers' ``generate`` on the same device with the
   same prompts as one padded batch per count (the naive baseline);
2. sleep: device memory in use (``torch.cuda.mem_get_info``; the process's RSS on a CPU) awake, after Sleep level 1
   (must give back the KV cache), after WakeUp, after level 2 (also the weights), after WakeUp; greedy tokens
   before and after must agree;
3. contract: the contract suite's fast subset (tests/contract through pytest) against the embedded engine on the
   device;
4. weight push: two ``agentloop engine serve`` processes on the device; the whole checkpoint to one of them by
   stream (UpdateWeights) and by path (LoadWeights of a safetensors file), GB/s;
5. failover: a Router over both; a greedy stream's server is SIGKILLed mid-stream; the tokens must be the first
   server's, then the survivor's continuation of the prompt and those tokens (and, reported, whether they equal an
   uninterrupted run).

Writes ``gpu_check.json`` and ``gpu_check.md`` (the table bench/RESULTS-gpu.md takes) to ``--out`` and exits 1 if
any part failed.

    python gpu_check.py --device cuda --out "$OUT"      # from the GPU kit (docs/serve-engines.md)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # CPU runs: the servers' OpenMP threads must not spin on shared cores

import grpc
import torch

from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import (
    ALL_RESOURCES,
    GenerateComplete,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)
from agentloop_grpc.engine_adapters.checkpoint import read_checkpoint
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle
from agentloop_grpc.launch.launcher import ServerProcess, agentloop_command
from agentloop_grpc.router import Fleet, GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

HERE = Path(__file__).resolve().parent
#: The kit's root (gpu_check.py beside tests/ and model/), else the repository's (bench/gpu_check.py).
ROOT = HERE if (HERE / "tests").is_dir() else HERE.parent
TOPICS = ["the sea", "a city at night", "mountains", "a robot", "autumn", "a library", "the desert", "a train"]
FAST_ROUTER = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)
#: The contract suite's fast subset on a GPU: everything but the fault suite, images, weight groups and vLLM's own.
CONTRACT_FAST = tuple(f"tests/contract/{name}.py" for name in (
    "test_generate", "test_generate_unary", "test_control", "test_stream_options", "test_default_length",
    "test_load_weights", "test_sessions"))
#: On a CPU (make test): a few tests that cross every layer (stream, sleep, weights).
CONTRACT_SMOKE = (
    "tests/contract/test_generate.py::test_stream_is_chunks_then_exactly_one_complete",
    "tests/contract/test_generate.py::test_greedy_is_deterministic",
    "tests/contract/test_control.py::test_sleep_refuses_generate_and_wake_restores",
    "tests/contract/test_control.py::test_update_weights_bumps_version_seen_in_tokens",
)


@dataclass(frozen=True)
class Sizes:
    model: dict[str, int]  # config fields over SmolLM2-135M's (empty: the real architecture)
    in_flight: tuple[int, ...]
    new_tokens: int
    max_model_len: int
    repeats: int
    failover_tokens: int
    kill_after: int  # tokens received before the SIGKILL
    contract: tuple[str, ...]
    contract_long_tokens: int  # a budget that keeps a request in flight for about a second
    #: The contract run overlaps the parts before it: on a CPU only, where their figures mean nothing and make
    #: test's time is short (on a GPU the suite would share the device with the throughput runs).
    contract_overlaps: bool


GPU_SIZES = Sizes({}, (1, 8, 32, 128), 128, 1024, 3, 512, 64, CONTRACT_FAST, 400, False)
CPU_SIZES = Sizes(
    {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 32},
    (1, 4), 8, 256, 1, 96, 16, CONTRACT_SMOKE, 200, True,
)


@dataclass
class Report:
    device: str
    machine: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Where the files go, rewritten after every part: a run cut short still leaves what it measured.
    out: Path | None = None


def _machine(device: str) -> dict[str, Any]:
    import transformers

    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else platform.processor()
    return {"gpu_or_cpu": gpu or platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def memory_used(device: str) -> int:
    """Bytes in use on ``device``: the whole GPU's (mem_get_info: what every process holds), else this process's RSS."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return total - free
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_model(files: Path, sizes: Sizes, target: Path) -> dict[str, Any]:
    """SmolLM2-135M's architecture (shrunk by ``sizes.model``) with random weights, saved with the tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(files, local_files_only=True)
    for name, value in sizes.model.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(target)
    for path in files.iterdir():  # tokenizer, chat template, generation config (eos ids); never weights
        if path.is_file() and path.name != "config.json" and path.suffix not in {".safetensors", ".bin", ".gguf"}:
            shutil.copyfile(path, target / path.name)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    text = model.config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return {"architecture": type(model).__name__, "parameters": params, "weight_bytes": params * 4,
            "layers": text.num_hidden_layers, "hidden_size": text.hidden_size,
            "kv_bytes_per_token": text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * 4,
            "folder": str(target)}


def chat_prompts(folder: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return [list(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]} (#{i})."}],
        tokenize=True, add_generation_prompt=True, return_dict=False)) for i in range(count)]


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)


async def _timed(engine: EngineLifecycle, request: GenerateRequest) -> tuple[float, list[int]]:
    """(seconds to the first token, the tokens) of one request."""
    start, first = time.perf_counter(), None
    tokens: list[int] = []
    async for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            first = first if first is not None else time.perf_counter() - start
            tokens += event.token_ids
        elif isinstance(event, GenerateComplete):
            break
    if first is None:
        raise RuntimeError(f"{request.request_id} produced no token")
    return first, tokens


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def engine_throughput(engine: EngineLifecycle, prompts: list[list[int]], sizes: Sizes) -> list[dict[str, Any]]:
    """Tokens/s and time to first token at each in-flight count (medians of ``sizes.repeats`` runs)."""
    await asyncio.gather(*(_timed(engine, GenerateRequest(f"warm-{i}", p, greedy(sizes.new_tokens)))
                           for i, p in enumerate(prompts[:8])))
    rows = []
    for count in sizes.in_flight:
        rates, firsts = [], []
        for repeat in range(sizes.repeats):
            await engine.flush_cache()  # every prompt is prefilled: no help from the run before
            start = time.perf_counter()
            runs = await asyncio.gather(*(_timed(engine, GenerateRequest(f"c{count}-r{repeat}-{i}", p,
                                                                            greedy(sizes.new_tokens)))
                                          for i, p in enumerate(prompts[:count])))
            rates.append(sum(len(tokens) for _, tokens in runs) / (time.perf_counter() - start))
            firsts += [first for first, _ in runs]
        rows.append({"in_flight": count, "tokens_per_s": statistics.median(rates),
                     "ttft_p50_s": _percentile(firsts, 0.5), "ttft_p90_s": _percentile(firsts, 0.9)})
        print(f"embedded, {count} in flight: {rows[-1]['tokens_per_s']:.0f} tok/s, TTFT p50 "
              f"{rows[-1]['ttft_p50_s'] * 1e3:.0f} ms", flush=True)
    return rows


async def sleep_cycle(engine: EngineLifecycle, device: str, prompt: list[int], model: dict[str, Any],
                      kv_bytes: int) -> dict[str, Any]:
    """Memory in use through Sleep(1), WakeUp, Sleep(2), WakeUp; what each level must give back; same outputs."""
    _, before = await _timed(engine, GenerateRequest("sleep-before", prompt, greedy(16)))
    used = {"awake": memory_used(device)}
    steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("level 1", lambda: engine.sleep(1)), ("woken", lambda: engine.wake_up(ALL_RESOURCES)),
        ("level 2", lambda: engine.sleep(2)), ("woken again", lambda: engine.wake_up(ALL_RESOURCES))]
    for name, step in steps:
        await step()
        used[name] = memory_used(device)
    _, after = await _timed(engine, GenerateRequest("sleep-after", prompt, greedy(16)))
    freed_kv, freed_all = used["awake"] - used["level 1"], used["awake"] - used["level 2"]
    weights = model["weight_bytes"]
    if device.startswith("cuda"):  # the whole budget is allocated on a GPU: all of it must come back
        checks = {"level 1 gave back the KV cache": freed_kv >= 0.9 * kv_bytes,
                  "level 2 gave back the KV cache and the weights": freed_all >= 0.9 * (kv_bytes + weights)}
    else:  # the CPU's KV pages are resident only where written: only the weights' share is certain
        checks = {"level 2 gave back the weights": freed_all - max(freed_kv, 0) >= 0.5 * weights}
    checks["outputs after WakeUp equal those before"] = before == after
    return {"used_bytes": used, "kv_bytes": kv_bytes, "weight_bytes": weights, "freed_level1_bytes": freed_kv,
            "freed_level2_bytes": freed_all, "checks": checks, "ok": all(checks.values())}


def naive_generate(folder: Path, device: str, prompts: list[list[int]], sizes: Sizes) -> dict[int, float]:
    """transformers' generate on the same device: each in-flight count's prompts as one left-padded batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).to(device)
    model.eval()
    pad = model.generation_config.pad_token_id or model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad

    def run(batch: list[list[int]]) -> float:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=sizes.new_tokens,
                                 min_new_tokens=sizes.new_tokens, do_sample=False, pad_token_id=pad)
        synchronize(device)
        return (out.shape[1] - width) * len(batch) / (time.perf_counter() - start)

    run(prompts[:2])  # warm-up
    rates = {count: statistics.median(run(prompts[:count]) for _ in range(sizes.repeats))
             for count in sizes.in_flight}
    for count, rate in rates.items():
        print(f"naive generate, batch of {count}: {rate:.0f} tok/s", flush=True)
    return rates


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def contract(folder: Path, device: str, sizes: Sizes, scratch: Path) -> dict[str, Any]:
    """The contract suite's subset through pytest, in a child process, against the embedded engine on ``device``."""
    xml = scratch / "contract.xml"
    overrides = {"model": str(folder), "device": device, "cache_dir": str(scratch / "contract-cache"),
                 "grammar_workers": 1, "long_tokens": sizes.contract_long_tokens}
    # only the plugins the suite needs: a machine's own (benchmark, cov, ...) may not load with the kit's pytest
    env = {**os.environ, "AGENTLOOP_CONTRACT_ENGINES": "embedded", "AGENTLOOP_CONTRACT_EMBEDDED": json.dumps(overrides),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", "-p",
         "pytest_timeout", "-k", "embedded", "-m", "not fault", "--junitxml", str(xml), *sizes.contract],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    seconds = time.perf_counter() - start
    if not xml.is_file():
        output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise RuntimeError(f"pytest wrote no report (exit {done.returncode}):\n{output}")
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{xml} holds no testsuite"
    failures = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                if case.find("failure") is not None or case.find("error") is not None]
    counts = {name: int(suite.get(name, 0)) for name in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    print(f"contract: {passed} passed, {len(failures)} failed, {counts['skipped']} skipped in {seconds:.0f} s",
          flush=True)
    return {"passed": passed, "failed": len(failures), "skipped": counts["skipped"], "seconds": seconds,
            "failures": failures, "output_tail": done.stdout[-2000:] if failures or done.returncode else "",
            "ok": done.returncode == 0 and passed > 0}


def engine_servers(folder: Path, device: str, sizes: Sizes, scratch: Path, count: int) -> list[ServerProcess]:
    """``agentloop engine serve`` processes of the model on ``device`` (not started)."""
    args = [*agentloop_command(), "engine", "serve", "--port", "0", "--model", str(folder),
            "--set", f"device={device}", "--set", "max_running=8", "--set", f"max_model_len={sizes.max_model_len * 2}",
            "--set", "threads=1", "--set", "grammar_workers=1", "--set", f"cache_dir={scratch / 'server-cache'}",
            "--log-level", "WARNING"]
    # terminate_with_parent: they run in sessions of their own, which must not outlive a check that is killed
    return [ServerProcess(args, scratch / f"server-{i}.log", terminate_with_parent=True) for i in range(count)]


async def serving(servers: list[ServerProcess]) -> list[ServerProcess]:
    """Start ``servers`` together; the first failure is raised once all are done."""
    results = await asyncio.gather(*(server.start(timeout_s=300) for server in servers), return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure
    return servers


async def weight_push(address: str, folder: Path, sizes: Sizes, scratch: Path) -> dict[str, Any]:
    """The whole checkpoint to one server by stream and by path; GB/s of each (medians, after one warm-up). It runs
    after the failover, on the survivor: the Router holds a server back while its weight version trails another's."""
    tensors, total = read_checkpoint(str(folder))
    file = scratch / "push.safetensors"
    write_safetensors(file, tensors)
    timings: dict[str, list[float]] = {"stream": [], "path": []}
    async with Fleet([address]) as fleet:
        await fleet.wait_ready(1, timeout_s=120)
        version = 0
        for name in timings:
            for _ in range(sizes.repeats + 1):
                version += 1
                start = time.perf_counter()
                if name == "stream":
                    result = await fleet.update_weights(tensors, version)
                else:
                    result = await fleet.load_weights(str(file), version)
                result.raise_for_errors()
                timings[name].append(time.perf_counter() - start)
    rates = {name: total / statistics.median(runs[1:]) / 1e9 for name, runs in timings.items()}
    print(f"weight push of {total / 1e6:.0f} MB: stream {rates['stream']:.2f} GB/s, path {rates['path']:.2f} GB/s",
          flush=True)
    return {"bytes": total, "tensors": len(tensors), "stream_gb_per_s": rates["stream"],
            "path_gb_per_s": rates["path"], "ok": True}


async def _direct(address: str, prompt: list[int], tokens: int) -> list[int]:
    """Greedy tokens from one server, without the Router."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.TokenGenerateStub(channel)
        request = generation_pb2.GenerateRequest(
            request_id=f"direct-{time.monotonic_ns()}", prompt_ids=prompt,
            sampling_params=generation_pb2.SamplingParams(max_new_tokens=tokens, temperature=0, ignore_eos=True))
        return [t async for m in stub.Generate(request, timeout=300) for t in m.chunk.token_ids]


async def failover(servers: list[ServerProcess], prompt: list[int], sizes: Sizes) -> dict[str, Any]:
    """SIGKILL the server of a greedy stream after ``kill_after`` tokens; check what the Router returns."""
    by_address = {server.address: server for server in servers}
    session, received, killed_at = "gpu-check-failover", 0, 0
    victim: str | None = None
    result: GenerateResult | None = None
    async with Router(list(by_address), FAST_ROUTER) as router:
        await router.fleet.wait_ready(len(servers), timeout_s=120)
        async for event in router.stream(GenerateCall(session, prompt, greedy(sizes.failover_tokens), timeout_s=300)):
            if isinstance(event, GenerateResult):
                result = event
                break
            received += len(event.token_ids)
            if victim is None and received >= sizes.kill_after:
                victim = router.session_server(session)
                by_address[victim].process.kill()
                killed_at = received
    if result is None or victim is None:
        raise RuntimeError("the stream ended before the server could be killed")
    survivor = next(address for address in by_address if address != victim)
    tokens = list(result.token_ids)
    reference = await _direct(survivor, prompt, sizes.failover_tokens)
    split = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), len(tokens))
    resumed_at = await _resume_point(survivor, prompt, tokens, killed_at, split)
    checks = {"one failover, to the survivor": result.failovers == 1 and result.servers == (victim, survivor),
              "every token once": len(tokens) == sizes.failover_tokens,
              "the survivor continued the tokens it was given": resumed_at is not None}
    print(f"failover: killed after {killed_at} tokens; {result.failovers} failover; equal to an uninterrupted run: "
          f"{split == len(tokens)}", flush=True)
    return {"tokens": len(tokens), "killed_after": killed_at, "resumed_at": resumed_at, "failovers": result.failovers,
            "equal_to_uninterrupted": split == len(tokens), "first_difference": split, "checks": checks,
            "ok": all(checks.values())}


async def _resume_point(survivor: str, prompt: list[int], tokens: list[int], killed_at: int, split: int) -> int | None:
    """Where the survivor took over: the first ``r`` from ``killed_at`` on (the victim may have sent a few tokens
    more before it died) whose continuation of the prompt and ``tokens[:r]`` is ``tokens[r:]``; None if none is.
    Equal to an uninterrupted run (``split`` at the end), every such ``r`` is."""
    if split == len(tokens):
        return killed_at
    for start in range(killed_at, min(split, killed_at + 16) + 1):
        if await _direct(survivor, prompt + tokens[:start], len(tokens) - start) == tokens[start:]:
            return start
    return None


async def in_process_parts(report: Report, folder: Path, device: str, sizes: Sizes, prompts: list[list[int]],
                           scratch: Path, starting: asyncio.Future[list[ServerProcess]]) -> None:
    max_running = max(sizes.in_flight)
    engine = EngineLifecycle(make_adapter("embedded", {
        "model": str(folder), "device": device, "max_running": max_running, "max_model_len": sizes.max_model_len,
        "cache_dir": str(scratch / "engine-cache"), "grammar_workers": 1}))
    await engine.start()
    try:
        await run_part(report, "throughput", lambda: _throughput(engine, prompts, sizes))
        kv_bytes = max_running * sizes.max_model_len * report.model["kv_bytes_per_token"]
        await asyncio.wait([starting])  # memory in use is the whole device's: the servers must be done loading
        await run_part(report, "sleep", lambda: sleep_cycle(engine, device, prompts[0], report.model, kv_bytes))
    finally:
        await engine.shutdown()


async def _throughput(engine: EngineLifecycle, prompts: list[list[int]], sizes: Sizes) -> dict[str, Any]:
    return {"rows": await engine_throughput(engine, prompts, sizes), "ok": True}


async def server_parts(report: Report, starting: asyncio.Future[list[ServerProcess]], folder: Path, sizes: Sizes,
                       prompt: list[int], scratch: Path) -> None:
    servers = await starting
    await run_part(report, "failover", lambda: failover(servers, prompt, sizes))
    live = [server for server in servers if server.process.returncode is None]
    await run_part(report, "weight_push", lambda: weight_push(live[0].address, folder, sizes, scratch))


async def run_part(report: Report, name: str, part: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Run one part; a failure is recorded with its traceback and the check goes on with the next."""
    start = time.perf_counter()
    try:
        report.parts[name] = await part()
    except Exception:  # noqa: BLE001  (a broken part must not hide the others' figures)
        report.parts[name] = {"ok": False, "error": traceback.format_exc(limit=8)}
        print(f"{name} FAILED:\n{report.parts[name]['error']}", file=sys.stderr, flush=True)
    report.parts[name]["seconds"] = time.perf_counter() - start
    if not report.parts[name]["ok"]:
        report.failed.append(name)
    if report.out is not None:
        write(report, report.out)


async def check(device: str, files: Path, out: Path | None = None) -> Report:
    sizes = GPU_SIZES if device.startswith("cuda") else CPU_SIZES
    report = Report(device, _machine(device), out=out)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as name:
        scratch = Path(name)
        folder = scratch / "model"
        report.model = build_model(files, sizes, folder)
        prompts = chat_prompts(folder, max(max(sizes.in_flight), 8))
        servers = engine_servers(folder, device, sizes, scratch, 2)
        starting = asyncio.ensure_future(serving(servers))  # they load while the parts before theirs run
        contract_run = lambda: run_part(  # noqa: E731
            report, "contract", lambda: asyncio.to_thread(contract, folder, device, sizes, scratch))
        overlapping = asyncio.ensure_future(contract_run()) if sizes.contract_overlaps else None
        try:
            await in_process_parts(report, folder, device, sizes, prompts, scratch, starting)

            async def naive() -> dict[str, Any]:
                rates = naive_generate(folder, device, prompts, sizes)  # nothing else computes meanwhile
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()  # its model is gone: the GPU memory it held goes back for the next parts
                for row in report.parts.get("throughput", {}).get("rows", []):
                    row["naive_tokens_per_s"] = rates[row["in_flight"]]
                return {"tokens_per_s": rates, "ok": True}

            await run_part(report, "naive_generate", naive)
            await (overlapping if overlapping is not None else contract_run())
            await run_part(report, "servers", lambda: _servers(report, starting, folder, sizes, prompts[0], scratch))
        finally:
            for task in (starting, overlapping):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (starting, overlapping) if t is not None), return_exceptions=True)
            await asyncio.gather(*(server.stop(grace_s=10) for server in servers), return_exceptions=True)
    report.seconds = time.perf_counter() - started
    return report


def write(report: Report, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    del data["out"]
    (out / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))


async def _servers(report: Report, starting: asyncio.Future[list[ServerProcess]], folder: Path, sizes: Sizes,
                   prompt: list[int], scratch: Path) -> dict[str, Any]:
    await server_parts(report, starting, folder, sizes, prompt, scratch)
    return {"ok": True}


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def markdown(report: Report) -> str:
    """The table a later session pastes into bench/RESULTS-gpu.md."""
    m, p = report.machine, report.parts
    lines = [f"## GPU check, {m['date']}: {m['gpu_or_cpu']} (`--device {report.device}`)", "",
             f"torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}; model: "
             f"{report.model.get('architecture')} of SmolLM2-135M's config"
             f"{'' if report.device.startswith('cuda') else ' shrunk for a CPU'}, random weights, fp32, "
             f"{report.model.get('parameters', 0) / 1e6:.1f}M parameters; {report.seconds:.0f} s in all; "
             f"{'every part passed' if not report.failed else 'FAILED: ' + ', '.join(report.failed)}.", "",
             "| part | result |", "|---|---|"]
    if "contract" in p and "passed" in p["contract"]:
        c = p["contract"]
        lines.append(f"| contract suite, fast subset | {c['passed']} passed, {c['failed']} failed, {c['skipped']} "
                     f"skipped in {c['seconds']:.0f} s |")
    if "sleep" in p and "used_bytes" in p["sleep"]:
        s = p["sleep"]
        used = " / ".join(_gib(v) for v in s["used_bytes"].values())
        lines.append(f"| memory in use: awake / Sleep 1 / WakeUp / Sleep 2 / WakeUp | {used} |")
        lines.append(f"| Sleep gave back: level 1 / level 2 (KV cache, weights) | {_gib(s['freed_level1_bytes'])} / "
                     f"{_gib(s['freed_level2_bytes'])} ({_gib(s['kv_bytes'])}, {_gib(s['weight_bytes'])}) |")
    if "weight_push" in p and "bytes" in p["weight_push"]:
        w = p["weight_push"]
        lines.append(f"| weight push, {w['bytes'] / 1e6:.0f} MB: stream / path | {w['stream_gb_per_s']:.2f} / "
                     f"{w['path_gb_per_s']:.2f} GB/s |")
    if "failover" in p and "tokens" in p["failover"]:
        f = p["failover"]
        lines.append(f"| failover: SIGKILL after {f['killed_after']} of {f['tokens']} tokens | "
                     f"{'token-exact' if f['ok'] else 'NOT token-exact'}; equal to an uninterrupted run: "
                     f"{'yes' if f['equal_to_uninterrupted'] else 'no, from token ' + str(f['first_difference'])} |")
    for name, part in p.items():
        if not part.get("ok"):
            lines.append(f"| {name} | FAILED: {part.get('error', part.get('checks', ''))!s:.200} |".replace("\n", " "))
    rows = p.get("throughput", {}).get("rows", [])
    if rows:
        lines += ["", "| in flight | embedded tok/s | TTFT p50 / p90 | naive generate tok/s | embedded / naive |",
                  "|---|---|---|---|---|"]
        for row in rows:
            naive = row.get("naive_tokens_per_s")
            baseline = f"{naive:.0f} | {row['tokens_per_s'] / naive:.2f}" if naive else "- | -"
            lines.append(f"| {row['in_flight']} | {row['tokens_per_s']:.0f} | {row['ttft_p50_s'] * 1e3:.0f} / "
                         f"{row['ttft_p90_s'] * 1e3:.0f} ms | {baseline} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: tiny sizes).")
    parser.add_argument("--model-files", type=Path, default=ROOT / "model",
                        help="SmolLM2-135M's config.json and tokenizer files (the kit's model/).")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu-check-results"),
                        help="Where gpu_check.json and gpu_check.md go (default: $OUT, else beside this script).")
    args = parser.parse_args()
    report = asyncio.run(check(args.device, args.model_files, args.out))
    write(report, args.out)
    print(markdown(report))
    print(f"wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
