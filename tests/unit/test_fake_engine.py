"""The fake engine's scheduling: batch capacity, priority order, a bounded queue (RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from agentloop_grpc.common.errors import EngineOverloadedError
from agentloop_grpc.common.types import GenerateComplete, GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine, StepClock
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.v1 import generation_pb2, generation_pb2_grpc

from .hash_seeds import outputs_under_hash_seeds


def _request(request_id: str, tokens: int, priority: int = 0) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        prompt_ids=(1, 2, 3),
        sampling=SamplingParams(max_new_tokens=tokens, ignore_eos=True),
        priority=priority,
    )


async def _run(engine: FakeEngine, request: GenerateRequest, finished: list[str]) -> GenerateComplete:
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            finished.append(request.request_id)
            return event
    raise AssertionError("no completion")


async def test_batch_capacity_and_priority_order() -> None:
    engine = FakeEngine(FakeEngineConfig(max_running=1, token_latency_s=0.001))
    await engine.start(lambda: 0)
    finished: list[str] = []
    first = asyncio.create_task(_run(engine, _request("first", 20), finished))
    await asyncio.sleep(0.005)
    queued = [
        asyncio.create_task(_run(engine, _request(name, 2, priority), finished))
        for name, priority in (("low", 0), ("high", 5), ("mid", 1))
    ]
    await asyncio.sleep(0)
    assert engine.load().running_requests == 1 and engine.load().waiting_requests == 3
    await asyncio.gather(first, *queued)
    assert finished == ["first", "high", "mid", "low"]
    await engine.shutdown()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="dp_rank"):
        FakeEngineConfig(dp_rank=2, dp_size=2)
    with pytest.raises(ValueError, match="latencies"):
        FakeEngineConfig(token_latency_s=-1)


async def test_full_queue_is_resource_exhausted_over_grpc() -> None:
    engine = FakeEngine(FakeEngineConfig(max_running=1, max_waiting=1, token_latency_s=0.01))
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = generation_pb2_grpc.TokenGenerateStub(channel)

            def call(request_id: str):
                params = generation_pb2.SamplingParams(max_new_tokens=3000, ignore_eos=True)  # ~30 s each
                return stub.Generate(
                    generation_pb2.GenerateRequest(request_id=request_id, prompt_ids=[1], sampling_params=params)
                )

            first, second = call("a"), call("b")  # either may reach the engine first
            async with asyncio.timeout(20):
                while (await stub.GetLoad(generation_pb2.GetLoadRequest())).waiting_requests < 1:
                    await asyncio.sleep(0.005)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                async for _ in call("c"):
                    pass
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "waiting queue is full" in error.value.details()
            first.cancel()
            second.cancel()
    finally:
        await server.stop(grace_s=1)


async def test_no_queue_means_only_the_batch_runs() -> None:
    engine = FakeEngine(FakeEngineConfig(max_running=1, max_waiting=0, token_latency_s=0.01))
    await engine.start(lambda: 0)
    finished: list[str] = []
    running = asyncio.create_task(_run(engine, _request("a", 5), finished))
    await asyncio.sleep(0.005)
    with pytest.raises(EngineOverloadedError):
        async for _ in engine.generate(_request("b", 1)):
            pass
    assert (await running).completion_tokens == 5
    await engine.shutdown()


def test_step_clock_keeps_steps_at_their_configured_time_when_wake_ups_are_late() -> None:
    clock = StepClock(max_debt_s=0.01)
    assert clock.sleep_s(now=100.0, step_s=0.004) == pytest.approx(0.004)
    # woken 1 ms late: the next step is 1 ms shorter, so two steps took 8 ms in all
    assert clock.sleep_s(now=100.005, step_s=0.004) == pytest.approx(0.003)
    # zero-latency steps still yield (sleep 0), and never sleep a negative time
    assert clock.sleep_s(now=100.010, step_s=0.0) == 0.0
    # far behind (50 ms): only max_debt_s (10 ms) is caught up, with steps that do not sleep, the rest is dropped
    assert [clock.sleep_s(now=100.060, step_s=0.004) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.002)]
    clock.reset()  # idle: the next step starts from now
    assert clock.sleep_s(now=200.0, step_s=0.004) == pytest.approx(0.004)


def _shared_prompt_request(request_id: str, suffix: int) -> GenerateRequest:
    """A 64-token shared prefix (4 blocks of 16) and a one-token suffix of its own."""
    return GenerateRequest(
        request_id=request_id,
        prompt_ids=tuple(range(100, 164)) + (suffix,),
        sampling=SamplingParams(max_new_tokens=200, ignore_eos=True),
    )


async def test_prompt_blocks_are_reusable_as_soon_as_they_are_prefilled() -> None:
    """As in vLLM and SGLang: a request arriving while another one with the same prefix still decodes hits it; of
    requests prefilled in the same step, the first computes it and the others hit it (vLLM v1 caches a request's
    full blocks when it allocates them, kv_cache_manager.allocate_slots; SGLang holds back a request whose prefix
    another of the batch computes)."""
    engine = FakeEngine(FakeEngineConfig(token_latency_s=0.002))
    await engine.start(lambda: 0)
    finished: list[str] = []
    together = [asyncio.create_task(_run(engine, _shared_prompt_request(f"t{i}", i), finished)) for i in range(2)]
    while engine.load().running_requests < 2:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)  # a few decode steps: both still run (200 tokens)
    later = await _run(engine, GenerateRequest("later", _shared_prompt_request("x", 9).prompt_ids,
                                               SamplingParams(max_new_tokens=2, ignore_eos=True)), finished)
    assert later.cached_prompt_tokens == 64  # before: 0, the prefix was cached only when a request finished
    first, second = await asyncio.gather(*together)
    assert sorted((first.cached_prompt_tokens, second.cached_prompt_tokens)) == [0, 64]
    await engine.shutdown()


async def _tokens(engine: FakeEngine, request: GenerateRequest) -> tuple[list[int], GenerateComplete]:
    tokens: list[int] = []
    async for event in engine.generate(request):
        if isinstance(event, GenerateComplete):
            return tokens, event
        tokens.extend(event.token_ids)
    raise AssertionError("no completion")


async def test_a_finished_requests_output_blocks_are_reusable_by_the_next_turn() -> None:
    engine = FakeEngine()
    await engine.start(lambda: 0)
    prompt = tuple(range(500, 560))  # 60 tokens: 3 full blocks; with 20 output tokens, 5
    first_turn = GenerateRequest("turn1", prompt, SamplingParams(max_new_tokens=20, ignore_eos=True))
    output, _ = await _tokens(engine, first_turn)
    next_turn = GenerateRequest("turn2", prompt + tuple(output) + (7, 8), SamplingParams(max_new_tokens=1))
    _, complete = await _tokens(engine, next_turn)
    assert complete.cached_prompt_tokens == 80
    other = GenerateRequest("other", prompt + (1,) * 22, SamplingParams(max_new_tokens=1))  # same prompt, other output
    _, complete = await _tokens(engine, other)
    assert complete.cached_prompt_tokens == 48  # the prompt's blocks only
    await engine.shutdown()


def test_the_token_stream_is_the_same_in_every_process() -> None:
    """Tests compare streams across server processes (failover resumes elsewhere): no per-process hash seed."""
    script = (
        "import asyncio\n"
        "from agentloop_grpc.engine_adapters.fake import FakeEngine\n"
        "from agentloop_grpc.common.types import GenerateRequest, SamplingParams\n"
        "async def main():\n"
        "    engine = FakeEngine(); await engine.start(lambda: 0); tokens = []\n"
        "    sampling = SamplingParams(max_new_tokens=8, temperature=0.0)\n"
        "    async for event in engine.generate(GenerateRequest('r', tuple(range(40)), sampling)):\n"
        "        tokens.extend(getattr(event, 'token_ids', ()))\n"
        "    print(tokens)\n"
        "asyncio.run(main())\n"
    )
    runs = outputs_under_hash_seeds(script)
    assert len(runs) == 1 and len(runs.pop().split(",")) == 8


async def test_the_prefix_cache_evicts_the_least_recently_used_blocks() -> None:
    engine = FakeEngine(FakeEngineConfig(cache_blocks=12))
    await engine.start(lambda: 0)
    greedy = SamplingParams(max_new_tokens=1, temperature=0.0)
    old, recent, new = (tuple(range(base, base + 81)) for base in (1000, 2000, 3000))  # 5 full blocks each

    async def cached(name: str, prompt: tuple[int, ...]) -> int:
        _, complete = await _tokens(engine, GenerateRequest(name, prompt, greedy))
        return complete.cached_prompt_tokens

    assert (await cached("old", old), await cached("recent", recent)) == (0, 0)
    assert await cached("recent-again", recent) == 80  # a hit makes its blocks the most recently used
    assert await cached("new", new) == 0  # 15 blocks stored, 3 too many: the least recently used go, old's
    assert await cached("recent-3", recent) == 80
    # old's last three blocks went, tail first (as vLLM frees a request's blocks): its first two still hit
    assert await cached("old-again", old) == 32
    await engine.shutdown()


async def test_the_last_prompt_token_is_always_computed_and_a_flush_forgets_every_block() -> None:
    engine = FakeEngine()
    await engine.start(lambda: 0)
    greedy = SamplingParams(max_new_tokens=1, temperature=0.0)
    prompt = tuple(range(700, 732))  # exactly 2 full blocks

    async def cached(name: str) -> int:
        _, complete = await _tokens(engine, GenerateRequest(name, prompt, greedy))
        return complete.cached_prompt_tokens

    # the second block ends with the last prompt token, whose logits choose the first output token
    assert (await cached("cold"), await cached("warm")) == (0, 16)
    await engine.flush_cache()
    assert engine.load().prefix_cache_hit_rate == 0.0
    assert await cached("flushed") == 0
    await engine.shutdown()


def test_what_the_prefix_cache_keeps_of_a_sequence_is_a_prefix_of_it() -> None:
    """Whatever is stored and evicted, the cached blocks of every sequence are a prefix of it (its tail leaves
    before its head), so a lookup that stops at the first uncached block finds every cached one."""
    rng = random.Random(0)
    engine = FakeEngine(FakeEngineConfig(cache_blocks=40))
    chains: list[list[int]] = []
    for step in range(2000):
        if chains and rng.random() < 0.5:
            chain = rng.choice(chains)  # a sequence seen before, stored again (a hit refreshes it)
        else:  # a new sequence, half the time sharing the first blocks of an earlier one
            base = rng.choice(chains)[: rng.randint(0, 6)] if chains and rng.random() < 0.5 else []
            chain = base + [step * 100 + i for i in range(rng.randint(1, 8))]
            chains.append(chain)
        engine._store(chain)
        assert len(engine._cache) <= 40
        for chain in chains:
            present = [key in engine._cache for key in chain]
            assert present == sorted(present, reverse=True)


async def test_a_slow_reader_gets_merged_chunks_that_keep_each_tokens_weight_version() -> None:
    """Tokens that piled up while nobody read are merged, but never across a weight update."""
    fake = FakeEngine()
    engine = EngineLifecycle(fake)
    await engine.start()
    request = GenerateRequest("slow", (1, 2, 3), SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=True))
    events = fake.generate(request)
    first = await anext(events)  # the engine now decodes ahead of its reader
    while len(fake._running["slow"].generated) < 3:
        await asyncio.sleep(0)
    await engine.update_weights([], weight_version=1, flush_cache=False)
    while engine.load().running_requests:  # all six decoded before the reader comes back
        await asyncio.sleep(0)
    rest = [event async for event in events]
    chunks = [first, *rest[:-1]]
    assert isinstance(rest[-1], GenerateComplete) and rest[-1].completion_tokens == 6
    versions = [v for chunk in chunks for v in [chunk.weight_version] * len(chunk.token_ids)]
    assert versions == [0, 0, 0, 1, 1, 1]
    assert len(chunks) == 3  # the first token, then one merged chunk per version
    assert all(len(chunk.logprobs) == len(chunk.token_ids) for chunk in chunks)
    await engine.shutdown()


async def test_an_ended_sessions_blocks_leave_first_but_not_those_a_live_session_shares() -> None:
    engine = FakeEngine(FakeEngineConfig(cache_blocks=12))
    await engine.start(lambda: 0)
    greedy = SamplingParams(max_new_tokens=1, temperature=0.0)
    old, ended, filler = (tuple(range(base, base + 81)) for base in (1000, 2000, 3000))  # 5 full blocks each

    async def cached(name: str, prompt: tuple[int, ...], session: str = "") -> int:
        _, complete = await _tokens(engine, GenerateRequest(name, prompt, greedy, session_id=session))
        return complete.cached_prompt_tokens

    await cached("old", old, "live")
    await cached("sibling", old, "sibling")  # the same prompt: both sessions hold its blocks
    await cached("ended", ended, "ended")
    assert await engine.end_sessions(["sibling", "unknown"]) == 0  # "live" still holds every block of it
    assert await engine.end_sessions(["ended"]) == 5
    assert await engine.end_sessions(["ended"]) == 0  # forgotten
    assert await cached("filler", filler) == 0  # 15 blocks, 3 too many: the ended session's go, tail first
    assert await cached("old-again", old) == 80  # without the hint the least recently used, old's, would go
    assert await cached("ended-again", ended) == 32
    await engine.shutdown()


async def test_the_prefix_cache_is_keyed_by_the_weight_version() -> None:
    """As the real engines': after an update a prompt misses once (no KV of other weights), then hits again."""
    version = 0
    engine = FakeEngine()
    await engine.start(lambda: version)
    prompt = tuple(range(900, 950))

    async def cached(name: str) -> int:
        _, complete = await _tokens(engine, GenerateRequest(name, prompt, SamplingParams(max_new_tokens=1)))
        return complete.cached_prompt_tokens

    assert (await cached("v0"), await cached("v0-again")) == (0, 48)
    version = 1
    assert (await cached("v1"), await cached("v1-again")) == (0, 48)
    await engine.shutdown()


async def test_the_kv_usage_counts_the_running_requests_prompt_and_output_tokens() -> None:
    """The fake keeps its KV count as requests start, decode and leave (every completion reports it); it must
    stay what summing over the running requests gives, through finishes, aborts and requests left waiting."""
    config = FakeEngineConfig(max_running=2, token_latency_s=0.002, max_model_len=512)
    engine = FakeEngine(config)
    await engine.start(lambda: 0)
    capacity = config.max_running * config.max_model_len

    def held() -> float:  # the definition: prompt + generated tokens of each running request
        running = engine._running.values()  # the definition reads the engine's own table
        return sum(len(r.request.prompt_ids) + len(r.generated) for r in running) / capacity

    finished: list[str] = []
    short = asyncio.create_task(_run(engine, _request("short", 3), finished))
    long = asyncio.create_task(_run(engine, _request("long", 400), finished))
    waiting = asyncio.create_task(_run(engine, _request("waiting", 400), finished))
    async with asyncio.timeout(30):  # the machine may be slow; a count that never settles fails here, not later
        while not finished:
            assert engine.load().kv_cache_usage == held()
            await asyncio.sleep(0.001)
        while engine.load().running_requests < 2:  # the waiting one takes the finished one's place
            await asyncio.sleep(0.001)
    await engine.freeze()
    assert engine.load().kv_cache_usage == held() > 0
    await engine.thaw()
    await engine.abort(["long", "waiting"])
    await asyncio.gather(short, long, waiting)
    assert engine.load().kv_cache_usage == held() == 0.0
    await engine.shutdown()
