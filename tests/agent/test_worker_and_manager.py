"""Workers isolate failures; infrastructure failures are told apart; the manager runs in process and on Ray."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, AgentLoopWorker, Sample, Termination, WorkerSpec
from agentloop_grpc.agent.loop_player import split
from agentloop_grpc.agent.reward import Outcome
from agentloop_grpc.common.types import EngineState
from agentloop_grpc.router import Router, RouterConfig
from agentloop_grpc.tools.client import GrpcToolClient

from ..ray_start import init_ray
from ..router.conftest import free_port
from ..tools.conftest import tool_server
from .conftest import TextScript, call, loop_context, scripted_engine

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)


def _exploding_reward(outcome: Outcome) -> float:
    if outcome.sample.sample_id == "boom":
        raise RuntimeError("the reward function broke")
    return 0.5


async def test_ended_trajectories_leave_no_session_in_the_router(codec):
    async with loop_context(codec, [call("calculator", expression="2+3"), "5"]) as (ctx, loops, _s):
        samples = [Sample(sample_id=f"s{i}", messages=QUESTION, loop=("tool", "single_turn")[i % 2])
                   for i in range(6)]
        trajectories = await AgentLoopWorker(loops).run(samples)
        assert not any(t.failed for t in trajectories)
        assert isinstance(ctx.generator, Router) and ctx.generator.live_sessions == 0


async def test_one_broken_sample_never_fails_the_batch(codec):
    replies = [call("calculator", expression="2+3"), "5"]
    async with loop_context(codec, replies, reward=_exploding_reward) as (_, loops, _s):
        samples = [
            Sample(sample_id="ok-1", messages=QUESTION),
            Sample(sample_id="boom", messages=QUESTION),
            Sample(sample_id="no-such-loop", messages=QUESTION, loop="nope"),
            Sample(sample_id="unknown-tool", messages=QUESTION, tools=("web_search",)),
            Sample(sample_id="ok-2", messages=QUESTION),
        ]
        done: list[str] = []
        worker = AgentLoopWorker(loops, max_concurrency=2)
        result = await worker.run(samples, on_done=lambda t: done.append(t.sample_id))
    assert [t.sample_id for t in result] == [s.sample_id for s in samples] and sorted(done) == sorted(
        s.sample_id for s in samples)
    by_id = {t.sample_id: t for t in result}
    assert by_id["ok-1"].reward == 0.5 and by_id["ok-2"].reward == 0.5 and not by_id["ok-1"].failed
    assert by_id["boom"].failed and "the reward function broke" in by_id["boom"].error
    assert by_id["no-such-loop"].failed and "no loop named 'nope'" in by_id["no-such-loop"].error
    assert by_id["unknown-tool"].failed and "unknown tools ['web_search']" in by_id["unknown-tool"].error
    assert not any(t.infrastructure_failure for t in result)


async def test_a_dead_tool_server_is_an_infrastructure_failure(codec):
    dead = GrpcToolClient(f"127.0.0.1:{free_port()}", timeout_s=2)
    async with tool_server() as (_, live):
        specs = await live.list_tools()
    replies = [call("calculator", expression="2+3"), "5"]
    async with loop_context(codec, replies) as (ctx, _, _s):
        from agentloop_grpc.agent import LoopContext, LoopRegistry

        ctx = LoopContext(generator=ctx.generator, codec=codec, tools=dead, tool_specs={s.name: s for s in specs})
        [t] = await AgentLoopWorker(LoopRegistry.default(ctx)).run([Sample(sample_id="s", messages=QUESTION)])
    await dead.close()
    assert t.failed and t.infrastructure_failure and "CreateInstance" in t.error
    assert t.assistant_turns == 1  # what was generated before the failure is kept


async def test_a_dead_engine_is_an_infrastructure_failure(codec):
    from agentloop_grpc.agent import LoopContext, LoopRegistry

    async with Router([f"127.0.0.1:{free_port()}"], RouterConfig(no_server_wait_s=0.5)) as router:
        dead = LoopContext(generator=router, codec=codec)
        [t] = await AgentLoopWorker(LoopRegistry.default(dead)).run([Sample(sample_id="s", messages=QUESTION)])
    assert t.failed and t.infrastructure_failure


async def test_async_and_sync_rewards_run_as_each_trajectory_ends(codec):
    finished: list[str] = []

    async def reward(outcome: Outcome) -> float:
        finished.append(outcome.sample.sample_id)
        return 1.0

    def slow_prompt(text: str) -> str:
        return "short" if "quick" in text else "a much longer answer " * 20

    async with loop_context(codec, slow_prompt, reward=reward) as (_ctx, loops, _s):
        samples = [Sample(sample_id="slow", messages=({"role": "user", "content": "slow one"},), loop="single_turn"),
                   Sample(sample_id="quick", messages=({"role": "user", "content": "quick one"},), loop="single_turn")]
        result = await AgentLoopWorker(loops).run(samples)
    assert [t.reward for t in result] == [1.0, 1.0] and sorted(finished) == ["quick", "slow"]


def test_split_is_contiguous_and_balanced():
    samples = [Sample(sample_id=str(i), messages=QUESTION) for i in range(7)]
    chunks = split(samples, 3)
    assert [len(c) for c in chunks] == [3, 2, 2] and [s for c in chunks for s in c] == samples


@pytest.mark.slow
@pytest.mark.parametrize("use_ray", [False, True], ids=["in-process", "ray"])
async def test_manager_runs_a_batch_with_tools_and_hybrid_mode(codec, use_ray):
    if use_ray:
        # as the manager would, with a second try; 4 CPUs, what the verl replica tests need, so later suites
        # reuse this Ray instead of restarting it
        init_ray(num_cpus=4, include_dashboard=False, log_to_driver=False)
    script = TextScript(codec, [call("calculator", expression="6*7"), call("check_answer", answer="42")])
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(scripted_engine(script))
        tools, _ = await stack.enter_async_context(tool_server())
        spec = WorkerSpec(engines=(engine,), tool_server=f"127.0.0.1:{tools.port}", max_concurrency=8)
        manager = await stack.enter_async_context(AgentLoopManager(spec, num_workers=2, use_ray=use_ray, hybrid=True))
        samples = [
            Sample(sample_id=f"q{i}", messages=({"role": "user", "content": "6 times 7?"},), ground_truth="42",
                   tools_kwargs={"check_answer": {"ground_truth": "42"}}, group_id="g")
            for i in range(6)
        ]
        batch = await manager.generate(samples)
        info = await manager.control.server_info()
    assert [t.sample_id for t in batch.trajectories] == [s.sample_id for s in samples]
    assert all(t.termination is Termination.STOP and t.reward == 1.0 for t in batch.trajectories)
    m = batch.metrics
    assert m.trajectories == 6 and m.failures == 0 and m.tool_calls == 12 and m.mean_reward == 1.0
    assert m.mean_assistant_turns == 2 and m.slowest_sample in {s.sample_id for s in samples}
    # hybrid: the engines were asleep again after the rollout
    [response] = info.responses.values()
    assert response.state is EngineState.SLEEPING


async def test_batch_with_duplicate_ids_is_refused(codec):
    spec = WorkerSpec(engines=("127.0.0.1:1",))
    manager = AgentLoopManager(spec)
    with pytest.raises(ValueError, match="unique"):
        await manager.generate([Sample(sample_id="a", messages=QUESTION)] * 2)


class _StartWatch:
    """A loop that notes how many requests had reached the engine when each sample's loop started."""

    def __init__(self, loop, script: TextScript) -> None:
        self.loop = loop
        self.script = script
        self.seen_at_start: dict[str, int] = {}

    async def run(self, sample: Sample):
        self.seen_at_start[sample.sample_id] = len(self.script.requests)
        return await self.loop.run(sample)


async def test_first_requests_reach_the_engine_while_later_loops_still_start(codec):
    """Loops start one at a time: started all at once, no request left before every loop had done its first step
    (template render, tokenization), and the engine idled while the whole batch prepared."""
    async with loop_context(codec, ["5"]) as (_, loops, script):
        watch = _StartWatch(loops.get("tool"), script)
        samples = [Sample(sample_id=f"s{i}", messages=QUESTION, loop="watched") for i in range(32)]
        result = await AgentLoopWorker(loops.with_loop("watched", watch), max_concurrency=32).run(samples)
    assert not any(t.failed for t in result) and len(script.requests) == 32
    assert watch.seen_at_start["s0"] == 0
    assert watch.seen_at_start["s31"] > 0  # before the fix: 0, the first request had not left yet


async def test_cancelling_a_run_while_loops_start_cancels_every_started_loop(codec):
    async with loop_context(codec, ["5"]) as (_, loops, _s):
        started: list[str] = []

        class Slow:
            async def run(self, sample: Sample):
                started.append(sample.sample_id)
                await asyncio.sleep(60)

        run = asyncio.ensure_future(AgentLoopWorker(loops.with_loop("slow", Slow())).run(
            [Sample(sample_id=f"s{i}", messages=QUESTION, loop="slow") for i in range(1000)]
        ))
        while len(started) < 10:
            await asyncio.sleep(0)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        pending = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.endswith("run.<locals>.one")]
        assert pending == [] and 10 <= len(started) < 1000
