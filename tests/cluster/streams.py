"""What the cluster drivers share (the rollout side of a fault, run in the head's namespace): seeded generations
streamed through a Router with the time each piece arrived, the lines they trade with the test, and the check of
every result against the fake engine's own streams (an in-process fake of the same config computes them): the
tokens of the first server up to the cut, then the second server's continuation of the prompt plus those tokens,
nothing lost, nothing repeated."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import AsyncIterator

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router
from agentloop_grpc.router.endpoint import Endpoint

#: Sampled with a seed: a stream is a function of prompt and seed alone, on any server.
PARAMS = {"temperature": 1.0, "seed": 11, "ignore_eos": True}


def read_line(expected: str) -> float:
    """The test's next line, ``<expected> <unix time>``: the time."""
    word, at = sys.stdin.readline().split()
    assert word == expected, (word, expected)
    return float(at)


def say(*words: object) -> None:
    print(*words, flush=True)


async def stream(router: Router, session: str, prompt: list[int], tokens: int, arrivals: list[tuple[float, int]],
                 results: dict[str, GenerateResult]) -> None:
    """One generation; ``arrivals``: (unix time, tokens so far) at every chunk."""
    call = GenerateCall(session, prompt, SamplingParams(max_new_tokens=tokens, **PARAMS))
    received = 0
    async for event in router.stream(call, min_chunk_tokens=20):
        if isinstance(event, GenerateResult):
            results[session] = event
        else:
            received += len(event.token_ids)
            arrivals.append((time.time(), received))


async def check(reference: Router, result: GenerateResult, prompt: list[int], tokens: int) -> int:
    """Check ``result`` against the fake engine's streams (``reference``: an in-process one); return where the
    first server's tokens end (``tokens`` when one server made them all)."""
    async def produce(ids: list[int], count: int) -> tuple[int, ...]:
        return (await reference.generate(GenerateCall("ref", ids, SamplingParams(max_new_tokens=count, **PARAMS)))
                ).token_ids

    got = list(result.token_ids)
    whole = await produce(prompt, tokens)
    if tuple(got) == whole:
        return tokens
    cut = next(i for i, (a, b) in enumerate(zip(got, whole, strict=True)) if a != b)
    # the continuation's first token may equal the uninterrupted stream's (1 in vocab_size): look back a little
    for k in range(cut, max(-1, cut - 4), -1):
        if tuple(got[k:]) == await produce(prompt + got[:k], tokens - k):
            return k
    raise AssertionError(f"{result.session_id}: tokens are neither one server's stream nor a resumed one")


@contextlib.asynccontextmanager
async def reference_router(vocab_size: int) -> AsyncIterator[Router]:
    """A Router over an in-process fake engine of the cluster's config: what every stream should be."""
    engine = await create_server(FakeEngine(FakeEngineConfig(vocab_size=vocab_size)), "127.0.0.1:0")
    await start_adapter(engine)
    try:
        async with Router([f"127.0.0.1:{engine.port}"]) as reference:
            yield reference
    finally:
        await engine.stop(grace_s=0.1)


class Streams:
    """SESSIONS generations under way together through ``router``, and what arrived when."""

    def __init__(self, router: Router, name: str, sessions: int, tokens: int, first: int = 200) -> None:
        self.router, self.tokens = router, tokens
        self.prompts = {f"{name}{i}": [first + i, 7, len(name), 7, 9 + i] for i in range(sessions)}
        self.arrivals: dict[str, list[tuple[float, int]]] = {s: [] for s in self.prompts}
        self.results: dict[str, GenerateResult] = {}
        self.tasks = [asyncio.create_task(stream(router, s, p, tokens, self.arrivals[s], self.results))
                      for s, p in self.prompts.items()]
        self.placed: dict[str, str | None] = {}

    async def started(self) -> None:
        """Once every generation has tokens: prints ``streaming <placement>``."""
        while not all(self.arrivals.values()):
            await asyncio.sleep(0.02)
        self.placed = {s: self.router.session_server(s) for s in self.prompts}
        say("streaming", json.dumps(self.placed))

    async def finished(self, watched: Endpoint | None = None) -> float | None:
        """Wait for every generation (raising what one raised); the unix time ``watched`` was taken out meanwhile,
        if it was."""
        out = None
        while not all(t.done() for t in self.tasks):
            if out is None and watched is not None and not watched.healthy:
                out = time.time()
            await asyncio.sleep(0.01)
        await asyncio.gather(*self.tasks)
        return out

    def resumed(self, server: str, out: float | None, fault_at: float) -> dict[str, float]:
        """For each generation placed on ``server``: its first tokens after ``out`` (from elsewhere), seconds after
        the fault."""
        resumed = {}
        for session, marks in self.arrivals.items():
            later = [t for t, _ in marks if out is not None and t > out]
            if self.placed[session] == server and later:
                resumed[session] = later[0] - fault_at
        return resumed

    def longest_gap_s(self, session: str) -> float:
        times = [t for t, _ in self.arrivals[session]]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    async def report(self, reference: Router) -> dict:
        return {
            "placed": self.placed,
            "tokens": {s: len(r.token_ids) for s, r in self.results.items()},
            "servers": {s: list(r.servers) for s, r in self.results.items()},
            "failovers": {s: r.failovers for s, r in self.results.items()},
            "cut_at": {s: await check(reference, self.results[s], p, self.tokens) for s, p in self.prompts.items()},
            "longest_gap_s": {s: self.longest_gap_s(s) for s in self.prompts},
        }


async def new_session_on(router: Router, address: str, most: int = 64) -> tuple[str | None, int]:
    """Place new sessions, four at a time (concurrent ones go to the least loaded: every server), until one lands on
    ``address``; that session (None after ``most``) and how many were tried."""
    landed, tried = None, 0
    while landed is None and tried < most:
        batch = await asyncio.gather(*(
            router.generate(GenerateCall(f"new{tried + i}", [5, 6, 7], SamplingParams(max_new_tokens=4)))
            for i in range(4)))
        tried += 4
        landed = next((r.session_id for r in batch if r.servers == (address,)), None)
    return landed, tried
