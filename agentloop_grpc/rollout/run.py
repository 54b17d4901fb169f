"""One rollout, start to finish: start what the config asks for, run every sample, write the outputs.

Steps: (1) read the dataset and check that every loop it names exists, and that every custom loop imports and
builds (before anything starts, so a bad file, a misspelt loop or a loop that cannot run fails fast); (2)
engines: launch replicas or use running servers, and check they answer; (3) tools: launch a server or use a
running one; (4) the manager runs the samples with a live progress display while a sampler records each server's
load, and the trackers of report_to get the metrics every ``trackers.log_every`` trajectories; (5) outputs:
trajectories.parquet, trace.jsonl, routing_trace.jsonl, batch.pt, summary.json, report.html, and the summary and
a samples table to the trackers. Servers this run started are stopped on the way out, also on Ctrl-C, and the
trajectories finished before an interruption are still written. A config with ``agent:`` plays the samples with
an agent of your own (integrations/gateway_player.py: a session per sample, ``samples_per_prompt`` sessions of a
row sharing its GRPO group) over one Router instead of the manager's loops, with the same steps and outputs; its
program is checked in step 1 (the callable imports, the command's program exists, the reward function imports,
the gateway extra is installed).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agentloop_grpc.agent import (
    AgentLoopManager,
    LoopContext,
    Sample,
    Trajectory,
    WorkerSpec,
    to_batch,
    write_parquet,
)
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.agent.routing_trace import FILE_NAME as ROUTING_TRACE
from agentloop_grpc.agent.routing_trace import write_routing_trace
from agentloop_grpc.agent.spec import ComponentSpec, build_loops, load_codec
from agentloop_grpc.agent.trajectory import drift_summary, routing_summary
from agentloop_grpc.integrations.external_agent import ExternalAgent
from agentloop_grpc.integrations.gateway_player import AgentConfigError, GatewayPlayer
from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher, ServerProcess, agentloop_command
from agentloop_grpc.router import NoHealthyServerError, Router, RouterConfig
from agentloop_grpc.router.call import GenerateCall
from agentloop_grpc.router.discovery import discovery_addresses, discovery_config
from agentloop_grpc.router.fleet import Fleet
from agentloop_grpc.router.result import GenerateResult
from agentloop_grpc.serving.metrics import serve_metrics
from agentloop_grpc.trackers import flatten, open_trackers
from agentloop_grpc.trackers.rollout import RolloutTracking

from .config import AgentRunConfig, Engines, RolloutConfig, Tools
from .dataset import read_rows, to_samples
from .error_causes import top_causes
from .progress import Progress

#: The run's launched engines, in its output folder (what ``agentloop engine launch`` writes).
DISCOVERY_FILE = "discovery.json"


class RolloutError(RuntimeError):
    """A run could not start or go on; the message is one sentence for the user."""


class LoopConfigError(RolloutError):
    """A loop the config or a dataset row names could not run: a bad config, found before anything starts."""


@dataclass
class LoadSample:
    time: float
    server: str
    in_flight: float


@dataclass
class RunRecord:
    """What a run produced (also when interrupted: then ``interrupted`` is True and trajectories are partial)."""

    output_dir: Path
    trajectories: list[Trajectory] = field(default_factory=list)
    metrics: RolloutMetrics | None = None
    load: list[LoadSample] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)
    servers: list[str] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0
    #: Where each tracker of report_to has the run, one line each.
    trackers: list[str] = field(default_factory=list)


def check_loops(config: AgentRunConfig, samples: Sequence[Sample]) -> None:
    """LoopConfigError when a custom loop's path imports nothing, a sample names a loop no worker will have, or a
    custom loop cannot be built or has no async run: found here, before any server starts, not as one failed
    trajectory per sample (or a worker's traceback) after the servers started."""
    for name, component in config.loops.items():
        try:
            component.resolve()
        except (ImportError, AttributeError, ValueError) as error:
            raise LoopConfigError(f"loops.{name}: {component.path} cannot be imported ({type(error).__name__}: "
                               f"{error})") from None
    for sample in samples:
        if sample.loop not in config.loop_names:
            raise LoopConfigError(f"sample {sample.sample_id} names the loop {sample.loop!r}, which is neither built "
                               f"in nor under loops; known: {config.loop_names}")
    if config.loops:
        try:
            build_loops(config.loops, _unconnected_context(config))
        except ValueError as error:
            raise LoopConfigError(str(error)) from None


class _NoEngines:
    """The generator of the context loops are built on before any server starts (a constructor may keep it,
    never call it)."""

    async def generate(self, call: GenerateCall) -> GenerateResult:
        raise RuntimeError("no engine server is connected while the loops are checked")

    def close_session(self, session_id: str) -> None:
        return None


def _unconnected_context(config: AgentRunConfig) -> LoopContext:
    """A worker's context as far as it exists before the servers start: the codec and the loop config, no
    engines, tools or interactions."""
    model_dir = config.engines.launch.model_folder if config.engines.launch else None
    try:
        codec = load_codec(model_dir, config.loop)
    except (OSError, ValueError) as error:
        raise RolloutError(f"the loops cannot be checked: the tokenizer of {model_dir or 'the default model'} "
                           f"does not load ({error})") from None
    return LoopContext(generator=_NoEngines(), codec=codec, config=config.loop)


async def start_engines(engines: Engines, stack: AsyncExitStack, out: Path) -> tuple[list[str], str | None]:
    """The engine servers' addresses (launched here and stopped by ``stack``, or given) and the model folder of
    launched ones (None: the default model, or servers this run did not start)."""
    if engines.launch is not None:
        launch = engines.launch
        launcher = EngineLauncher(
            EngineLaunch(engine=launch.engine, dp=launch.replicas, extra_args=launch.extra_args,
                         startup_timeout_s=launch.startup_timeout_s),
            out / "logs",
            terminate_with_parent=True,  # a run killed without notice (SIGKILL, SIGTERM) must not leave them up
            restart_lost=launch.restart_lost,
        )
        await stack.enter_async_context(launcher)
        launcher.watch(launcher.write_discovery(out / DISCOVERY_FILE))  # losses reported (and restarted)
        return launcher.addresses, launch.model_folder
    if engines.discovery_file is not None:
        path = Path(engines.discovery_file)
        try:
            return discovery_addresses(path), None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise RolloutError(f"the discovery file {path} cannot be read ({error})") from None
    return list(engines.addresses), None


def engine_source(engines: Engines, addresses: Sequence[str], out: Path) -> tuple[tuple[str, ...], str | None]:
    """What the run's Routers are built from: (addresses, None), or ((), a discovery file they follow): the
    config's, or the one this run's launcher rewrites as it restarts lost replicas (``restart_lost``)."""
    if engines.discovery_file is not None:
        return (), engines.discovery_file
    if engines.launch is not None and engines.launch.restart_lost:
        return (), str((out / DISCOVERY_FILE).absolute())  # read by workers that may run elsewhere (Ray)
    return tuple(addresses), None


def routing(config: AgentRunConfig) -> RouterConfig:
    """The run's router config, with the discovery file's TLS and tokens when its engines come from one."""
    path = config.engines.discovery_file
    return discovery_config(path, config.router) if path is not None else config.router


async def start_tools(tools: Tools, stack: AsyncExitStack, out: Path) -> str | None:
    """The tool server's address (launched here and stopped by ``stack``, or given); None: no tools."""
    if tools.address is not None:
        return tools.address
    if tools.launch is None:
        return None
    path = Path(str(resources.files("agentloop_grpc.tools") / "builtin.yaml")) if tools.launch == "builtin" \
        else Path(tools.launch)
    if not path.is_file():
        raise RolloutError(f"the tools config {path} does not exist")
    server = ServerProcess([*agentloop_command(), "tools", "serve", "--config", str(path), "--port", "0"],
                           out / "logs" / "tools.log", terminate_with_parent=True)
    stack.push_async_callback(server.stop, 5.0)
    return await server.start(timeout_s=60)


def open_tracking(config: RolloutConfig, stack: AsyncExitStack, record: RunRecord,
                  progress: Progress) -> RolloutTracking:
    """The trackers of report_to, opened first: one that cannot start (no W&B login, a bad MLflow URI) fails
    before any server does."""
    trackers = stack.enter_context(open_trackers(config.report_to, config.trackers, record.output_dir,
                                                 flatten(config.model_dump(mode="json"))))
    record.trackers = trackers.locations()
    if trackers.names:
        progress.status(f"logging to {', '.join(trackers.names)}")
    return RolloutTracking(trackers, config.trackers.log_every, config.trackers.samples)


async def start_servers(config: RolloutConfig, stack: AsyncExitStack, record: RunRecord,
                        progress: Progress) -> tuple[list[str], str | None, str | None]:
    """2-3. The engine and tool servers, started together (stopped by ``stack``): the engines' addresses (also the
    record's servers), their model folder and the tool server's address."""
    progress.status("starting engine and tool servers")
    out = record.output_dir
    (addresses, model_dir), tool_address = await asyncio.gather(start_engines(config.engines, stack, out),
                                                                 start_tools(config.tools, stack, out))
    record.servers = list(addresses)
    return addresses, model_dir, tool_address


async def wait_engines(fleet: Fleet, addresses: Sequence[str], timeout_s: float) -> None:
    """Until every engine answers as SERVING; a RolloutError naming those that did not within ``timeout_s``."""
    try:
        await fleet.wait_ready(min_servers=len(addresses), timeout_s=timeout_s)
    except NoHealthyServerError:
        down = [a for a, e in fleet.servers.items() if not e.healthy]
        raise RolloutError(f"engine server(s) {', '.join(down)} did not answer as SERVING") from None


@asynccontextmanager
async def collecting(config: RolloutConfig, record: RunRecord, fleet: Fleet, tracking: RolloutTracking,
                     progress: Progress, started: float, samples: int) -> AsyncIterator[Callable[[Trajectory], None]]:
    """4-5 around the block that plays the samples: yields the ``on_done`` each finished trajectory goes to (the
    record, the progress display, the trackers) while the load of each server of ``fleet`` is sampled; on the way
    out, also when interrupted (the record says so), the record is completed and the outputs written."""
    progress.start(samples)
    sampler = asyncio.create_task(_sample_load(fleet, record))
    metrics = fleet.metrics

    def done(trajectory: Trajectory) -> None:
        record.trajectories.append(trajectory)
        progress.advance(trajectory)
        tracking.advance(trajectory, time.monotonic() - started)

    try:
        yield done
    except asyncio.CancelledError:
        record.interrupted = True
        raise
    finally:
        sampler.cancel()
        record.decisions = {d: metrics.value("agentloop_router_routing_decisions_total", decision=d)
                            for d in ("new", "sticky", "moved")}
        record.wall_s = time.monotonic() - started
        if record.metrics is None:
            record.metrics = RolloutMetrics.of(record.trajectories, record.wall_s)
        progress.stop()
        write_outputs(config, record, tracking)


async def _sample_load(fleet: Fleet, record: RunRecord, every_s: float = 0.25) -> None:
    """Record the requests in flight of each server of ``fleet`` every ``every_s`` (until cancelled); a server
    that joins while it runs (a lost replica restarted) is added to the record's servers."""
    while True:
        now = time.time()
        for server in fleet.servers:
            if server not in record.servers:
                record.servers.append(server)
            in_flight = fleet.metrics.value("agentloop_router_in_flight", server=server)
            record.load.append(LoadSample(now, server, in_flight))
        await asyncio.sleep(every_s)


async def run_rollout(config: RolloutConfig, progress: Progress, record: RunRecord) -> RunRecord:
    """Run the rollout into ``record`` (the caller keeps it, so an interrupted run's record is still there)."""
    if config.agent is not None:
        return await run_agent_rollout(config, progress, record)
    out = record.output_dir
    out.mkdir(parents=True, exist_ok=True)
    # 1. the dataset, before anything starts
    samples = to_samples(read_rows(config.dataset), config.dataset, config.samples_per_prompt)
    check_loops(config, samples)
    started = time.monotonic()
    async with AsyncExitStack() as stack:
        tracking = open_tracking(config, stack, record, progress)
        addresses, model_dir, tool_address = await start_servers(config, stack, record, progress)
        trace = out / "trace.jsonl"
        trace.unlink(missing_ok=True)
        engines, discovery_file = engine_source(config.engines, addresses, out)
        spec = WorkerSpec(
            # engines from a discovery file are followed: a server the launcher restarts joins the run
            engines=engines, discovery_file=discovery_file, tool_server=tool_address,
            tool_security=config.tools.security,
            model_dir=model_dir, loop=config.loop,
            router=routing(config), max_concurrency=config.max_concurrency, reward=config.reward_function,
            interactions=config.interactions, loops=config.loops, trace_path=str(trace) if config.trace else None,
        )
        manager = AgentLoopManager(spec, num_workers=config.workers, use_ray=config.ray)
        await stack.enter_async_context(manager)
        control = manager.control
        assert control is not None  # entered
        await wait_engines(control, addresses, config.router.no_server_wait_s)
        if config.metrics_port is not None:
            http = serve_metrics(control.metrics.registry, "127.0.0.1", config.metrics_port)
            stack.callback(http.shutdown)
            # printed whole (no status dots after it), so it can be copied or clicked
            progress.console.print(f"router metrics at http://127.0.0.1:{http.server_port}/metrics")
        # 4. the rollout
        async with collecting(config, record, control, tracking, progress, started, len(samples)) as done:
            batch = await manager.generate(samples, on_done=done)
            record.trajectories = list(batch.trajectories)  # the samples' order
            record.metrics = batch.metrics
    return record


def gateway_player(agent: ExternalAgent, reward: ComponentSpec | None, **options: Any) -> GatewayPlayer:
    """``agent`` as a player (``options``: GatewayPlayer's), its program checked: LoopConfigError (one line, a bad
    config) when it cannot run."""
    try:
        return GatewayPlayer(agent, reward, **options)
    except AgentConfigError as error:
        raise LoopConfigError(str(error)) from None


async def run_agent_rollout(config: RolloutConfig, progress: Progress, record: RunRecord) -> RunRecord:
    """``run_rollout`` for a config with an agent: a Router over the engines instead of the manager's workers."""
    assert config.agent is not None
    out = record.output_dir
    out.mkdir(parents=True, exist_ok=True)
    # 1. the dataset and the agent, before anything starts
    rows = read_rows(config.dataset)
    samples = to_samples(rows, config.dataset, config.samples_per_prompt)
    player = gateway_player(config.agent, config.reward_function, one_per_sample=False,
                            log_dir=out / "logs" / "agents")
    started = time.monotonic()
    async with AsyncExitStack() as stack:
        tracking = open_tracking(config, stack, record, progress)
        addresses, model_dir, _ = await start_servers(config, stack, record, progress)
        # 4. the Router, the gateway and its app, the agents
        engines, discovery_file = engine_source(config.engines, addresses, out)
        router = await stack.enter_async_context(
            Router.from_discovery_file(discovery_file, routing(config)) if discovery_file is not None
            else Router(engines, routing(config)))
        await wait_engines(router.fleet, addresses, config.router.no_server_wait_s)
        await player.start(router, model_dir, config.loop)
        stack.push_async_callback(player.close)
        async with collecting(config, record, router.fleet, tracking, progress, started, len(samples)) as done:
            sample_rows = [rows[i // config.samples_per_prompt] for i in range(len(samples))]
            record.trajectories = await player.play(samples, sample_rows, on_done=done)  # the samples' order
    return record


def write_outputs(config: RolloutConfig, record: RunRecord, tracking: RolloutTracking | None = None) -> None:
    """5. Parquet, the routing trace, the padded batch, summary.json, the report and the trackers' last step
    (whatever was finished)."""
    out = record.output_dir
    if not record.trajectories:
        return
    write_parquet(record.trajectories, out / "trajectories.parquet")
    write_routing_trace(record.trajectories, out / ROUTING_TRACE)
    codec = load_codec(config.engines.launch.model_folder if config.engines.launch else None)
    pad = codec.tokenizer.pad_token_id if codec.tokenizer.pad_token_id is not None else codec.tokenizer.eos_token_id
    if any(not t.failed for t in record.trajectories):
        to_batch(record.trajectories, pad_token_id=pad, prompt_length=config.prompt_length,
                 response_length=config.response_length).save(out / "batch.pt")
    summary = summarize(record)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if tracking is not None:
        tracking.finish(record.trajectories, record.wall_s, summary, codec.decode)
    if config.report:
        from .report import write_report

        write_report(record, summary, codec, out / "report.html")


def summarize(record: RunRecord) -> dict:
    ts = record.trajectories
    m = record.metrics
    decisions = record.decisions
    later = decisions.get("sticky", 0.0) + decisions.get("moved", 0.0)  # a session's 2nd, 3rd... requests
    return {
        "trajectories": len(ts),
        "interrupted": record.interrupted,
        "wall_s": round(record.wall_s, 2),
        "failures": m.failures,
        "infrastructure_failures": m.infrastructure_failures,
        "infrastructure_causes": m.infrastructure_causes,
        "mean_reward": round(m.mean_reward, 4),
        "correct_answers_rate": round(m.correct_rate, 4),
        "tool_call_attempts": m.tool_call_attempts,
        "valid_tool_calls_rate": round(m.valid_tool_call_rate, 4),
        "mean_assistant_turns": round(m.mean_assistant_turns, 2),
        "model_tokens": m.model_tokens,
        "model_tokens_per_s": round(m.model_tokens_per_s, 2),
        "terminations": m.terminations,
        "sticky_share": round(decisions.get("sticky", 0.0) / later, 4) if later else 0.0,
        "routing_decisions": decisions,
        "slowest_sample": m.slowest_sample,
        "slowest_s": round(m.slowest_s, 2),
        "drifted_trajectories": sum(t.drift is not None for t in ts),
        "drift": drift_summary(ts),  # per kind: how many, and the first one as an example
        "routed_experts": routing_summary(ts),
        "error_causes": [{"error": error, "count": count} for error, count in error_causes(ts)],
    }


def error_causes(trajectories: list[Trajectory], top: int = 5) -> list[tuple[str, int]]:
    """The failed trajectories' error causes (errors that differ only in numbers or ids are one), most common first,
    at most ``top`` of them."""
    return top_causes((t.error for t in trajectories if t.failed), top)
