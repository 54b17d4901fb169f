"""verl's agent-loop client path, verl's own way vs on ours: the same multi-turn workload through verl's real
``LLMServerClient`` and ``GlobalRequestLoadBalancer`` (Ray actors), and through ``AgentloopLLMClient`` (our Router
over gRPC), each to 2 servers holding the same fake engine at zero latency.

  (a) verl_calls: verl 0.9.1's ``LLMServerClient`` with the balancer actor that verl's ``get_router_handle``
      builds (called as ``LLMServerManager._init_global_load_balancer`` calls it), over 2 Ray async actors
      (max_concurrency 1000, as verl's replicas start them) whose ``generate`` has the signature of verl's vLLM
      server actor and returns its ``TokenOutput``. Per turn: ``acquire_server`` (a Ray call to the balancer
      actor), ``generate`` (a Ray call to the server actor), ``release_server`` (fire-and-forget).
  (b) verl_on_agentloop: ``AgentloopLLMClient`` (a subclass of verl's ``LLMServerClient``) -> Router (sticky by
      verl's request id) -> 2 ``agentloop engine serve --adapter fake`` processes: one unary gRPC call per turn.
Both servers' engines are our FakeEngine at zero latency (its scheduler, prefix cache, ids and logprobs), and verl's
sampling dict becomes its sampling parameters by the same function on both sides, so what differs is the client,
the balancer and the transport.

The workload is a driver of the client calls, not verl's ToolAgentLoop (which adds chat-template rendering and tool
parsing, the same work on both sides, and needs a tokenizer): per trajectory, as ToolAgentLoop does, one request id
(a uuid4 hex) for all its turns and the keyword arguments ToolAgentLoop passes to ``generate``; TURNS turns, turn k
sending the PROMPT_IDS-id prompt plus every earlier turn's response ids and TOOL_IDS tool-response ids, with verl's
sampling dict (temperature 1, top_p 1, top_k -1, repetition_penalty 1, logprobs) plus max_tokens and ignore_eos so
every turn is exactly NEW_TOKENS tokens with their logprobs on both sides. 1 and 64 trajectories in flight (asyncio,
one client per run, warmed up first), REPEATS times, the two paths one after the other (every other repeat in
reverse order). Each RATIO ``verl_on_agentloop_vs_verl_calls_<n>`` is (b)'s trajectories/s over (a)'s, paired
within a repeat (median of the per-repeat ratios, printed above it; see bench/transport.py for why pairing), target
1.5: the bar of transport's router_calls_vs_ray, now through verl's own client interface (whose Ray path makes a
balancer call besides the server call on every turn). The client CPU column (this process's CPU time per turn,
Ray's and gRPC's threads included) shows where the difference goes: the client side of each path.

Usage: python bench/verl_transport.py [--trajectories 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time
from uuid import uuid4

from closed_loop import drive
from transport import BIN, _median, _paired_ratio, _start

TURNS = 6
PROMPT_IDS = 2000
NEW_TOKENS = 16
TOOL_IDS = 8
SERVERS = 2
IN_FLIGHT = (1, 64)
ENGINE = {"max_running": 256}
PROMPT = list(range(1000, 1000 + PROMPT_IDS))
TOOL_RESPONSE = list(range(500, 500 + TOOL_IDS))
# verl's agent-loop dict (AgentLoopWorker builds it from the rollout config), plus a fixed budget; ignore_eos
# because a sampled eos would end a turn early on one side and not the other
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True,
            "max_tokens": NEW_TOKENS, "ignore_eos": True}
# no multi-modal inputs: what ToolAgentLoop passes for a text-only sample
TEXT_ONLY = {"image_data": None, "video_data": None, "mm_processor_output": None, "audio_data": None,
             "mm_processor_kwargs": None}
ROLLOUT = {"name": "vllm", "prompt_length": 2048, "response_length": 256, "full_determinism": False}


def _config():
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": ROLLOUT}})


async def _trajectory(client) -> None:
    """One trajectory's generate calls, as verl's ToolAgentLoop makes them."""
    request_id = uuid4().hex
    prompt_ids = list(PROMPT)
    for turn in range(TURNS):
        output = await client.generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=dict(SAMPLING),
                                       **TEXT_ONLY)
        if len(output.token_ids) != NEW_TOKENS or len(output.log_probs or ()) != NEW_TOKENS:
            raise RuntimeError(f"{type(client).__name__}: {len(output.token_ids)} ids, not {NEW_TOKENS} with logprobs")
        prompt_ids = prompt_ids + output.token_ids + (TOOL_RESPONSE if turn < TURNS - 1 else [])


async def _measure(client, trajectories: int, in_flight: int) -> dict[str, float]:
    """Warm up, then run ``trajectories`` with ``in_flight`` at a time: trajectories/s (``calls_per_s``), a
    trajectory's p50 and p99 (ms), the client process's CPU per turn.

    The warm-up is one wave of at least 4 per server at once, so that the balancer sends some to every server: on
    verl's side the first call through each server's handle (the balancer returns it) stalls for seconds."""
    await asyncio.gather(*(_trajectory(client) for _ in range(max(in_flight, 4 * SERVERS))))
    cpu = time.process_time()
    outcome = await drive(lambda i: _trajectory(client), trajectories, in_flight)
    # process-wide CPU: it counts Ray's and gRPC's own threads in this process, where the client's work goes
    outcome["cpu_ms_per_turn"] = 1000 * (time.process_time() - cpu) / (trajectories * TURNS)
    return outcome


# -- (a) verl's client, balancer and server actors -----------------------------------------------------------


def _server_actor_class():
    import ray

    @ray.remote
    class FakeServerActor:
        """verl's vLLM server actor as its client sees it (``generate``'s signature, a ``TokenOutput`` back), over
        our FakeEngine at zero latency."""

        def __init__(self, engine: dict) -> None:
            from agentloop_grpc.engine_adapters.factory import make_adapter

            self.engine = make_adapter("fake", engine)

        async def start(self) -> None:
            await self.engine.start(lambda: 0)  # no weight updates here: version 0

        async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                           audio_data=None, mm_processor_kwargs=None, priority=0):
            from verl.workers.rollout.replica import TokenOutput

            from agentloop_grpc.common.types import GenerateComplete, GenerateRequest
            from agentloop_grpc.integrations.verl.sampling import sampling_from_verl

            sampling = sampling_from_verl(sampling_params, ROLLOUT["response_length"])
            token_ids: list[int] = []
            log_probs: list[float] = []
            async for event in self.engine.generate(GenerateRequest(request_id, prompt_ids, sampling)):
                if isinstance(event, GenerateComplete):
                    return TokenOutput(
                        token_ids=token_ids, log_probs=log_probs if sampling.logprobs else None,
                        stop_reason="completed",
                        extra_fields={"global_steps": 0, "num_cached_tokens": event.cached_prompt_tokens},
                    )
                token_ids.extend(event.token_ids)
                log_probs.extend(event.logprobs)
            raise RuntimeError("the engine ended without a completion")

    return FakeServerActor


def _verl_calls(balancer, trajectories: int, in_flight: int) -> dict[str, float]:
    from verl.workers.rollout.llm_server import LLMServerClient

    return asyncio.run(_measure(LLMServerClient(_config(), balancer), trajectories, in_flight))


# -- (b) verl's client interface on our Router --------------------------------------------------------------


async def _on_agentloop(addresses: list[str], trajectories: int, in_flight: int) -> dict[str, float]:
    from agentloop_grpc.integrations.verl.client import AgentloopLLMClient

    client = AgentloopLLMClient(_config(), servers=addresses)
    try:
        await (await client.router()).fleet.wait_ready(min_servers=len(addresses))
        return await _measure(client, trajectories, in_flight)
    finally:
        await client.close()


# -- main ----------------------------------------------------------------------------------------------------


def _cases(trajectories: int, repeats: int) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Both paths, REPEATS times at each in-flight count; Ray must be initialised. Stops what it started."""
    import ray
    from verl.workers.rollout.router import get_router_handle

    processes, actors = [], []
    try:
        for _ in range(SERVERS):
            settings = [arg for name, value in ENGINE.items() for arg in ("--set", f"{name}={value}")]
            process, address = _start([str(BIN / "agentloop"), "engine", "serve", "--adapter", "fake", "--port", "0",
                                       "--log-level", "WARNING", *settings])
            processes.append((process, address))
        actors = [_server_actor_class().options(max_concurrency=1000).remote(ENGINE) for _ in range(SERVERS)]
        ray.get([actor.start.remote() for actor in actors])
        servers = {f"fake-server-{i}": actor for i, actor in enumerate(actors)}
        balancer = get_router_handle(servers=servers, router_config_path=None, full_determinism=False)
        actors.append(balancer)
        ray.get(balancer.get_status.remote())  # its actor process starts at its first call (seconds)
        addresses = [address for _, address in processes]
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for repeat in range(repeats):
            for in_flight in IN_FLIGHT:
                count = trajectories * (1 if in_flight == 1 else 4)  # a similar time per run at either count
                cases = [
                    ("verl_calls", lambda count=count, in_flight=in_flight: _verl_calls(balancer, count, in_flight)),
                    ("verl_on_agentloop",
                     lambda count=count, in_flight=in_flight: asyncio.run(_on_agentloop(addresses, count, in_flight))),
                ]
                for name, run in cases if repeat % 2 == 0 else cases[::-1]:
                    outcome = run()
                    results.setdefault((name, in_flight), []).append(outcome)
                    print(f"repeat {repeat + 1} {name:17s} in_flight {in_flight:2d}: {count:4d} trajectories "
                          f"{outcome['calls_per_s']:7.1f}/s  p50 {outcome['p50_ms']:7.1f} ms  "
                          f"p99 {outcome['p99_ms']:7.1f} ms  client CPU {outcome['cpu_ms_per_turn']:.2f} ms/turn",
                          flush=True)
        return results
    finally:
        for actor in actors:
            ray.kill(actor)
        for process, _ in processes:
            process.terminate()
            process.wait(30)


def _print_results(results: dict, repeats: int) -> None:
    print(f"\nmedians of {repeats} runs; {TURNS}-turn trajectories of a {PROMPT_IDS}-id prompt, {NEW_TOKENS} tokens "
          f"with logprobs and {TOOL_IDS} tool-response ids per turn; {SERVERS} servers; {os.cpu_count()} cores")
    print("p50 and p99: a trajectory's wall time; client CPU: this process's CPU time per turn (client and driver)")
    print(f"{'path':17s} {'in flight':>9s} {'traj/s':>7s} {'turns/s':>8s} {'p50 ms':>7s} {'p99 ms':>7s} "
          f"{'client CPU ms/turn':>18s}")
    for (name, in_flight), runs in sorted(results.items()):
        rate = _median(runs, "calls_per_s")
        print(f"{name:17s} {in_flight:9d} {rate:7.1f} {rate * TURNS:8.0f} {_median(runs, 'p50_ms'):7.1f} "
              f"{_median(runs, 'p99_ms'):7.1f} {_median(runs, 'cpu_ms_per_turn'):18.2f}")
    lines = []
    for in_flight in IN_FLIGHT:
        figure = f"verl_on_agentloop_vs_verl_calls_{in_flight}"
        ratio, per_repeat = _paired_ratio(results, "verl_on_agentloop", "verl_calls", in_flight, "calls_per_s")
        print(f"{figure} per repeat: {' '.join(f'{r:.2f}' for r in per_repeat)}")
        lines.append(f"RATIO {figure} {ratio:.2f} target 1.5")
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=64,
                        help="trajectories per run at 1 in flight (4 times as many at 64)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if importlib.util.find_spec("verl") is None:
        print("verl_transport skipped: verl is not installed (make setup installs it)")
        return 0
    os.environ["HF_HUB_OFFLINE"] = "1"  # inherited by the servers and Ray's workers

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        results = _cases(args.trajectories, args.repeats)
    finally:
        ray.shutdown()
    _print_results(results, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
