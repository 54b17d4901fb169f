"""The rollout side of the partition test, run in the head's namespace: ``python -m tests.cluster.partition_driver
DISCOVERY PARTITIONED_ADDRESS SESSIONS TOKENS``.

It talks to the test on stdin/stdout, one line each way per step:
  1. streams SESSIONS generations of TOKENS tokens through a Router built from the discovery file, half of them
     on the server to be partitioned; prints ``streaming`` once every one has tokens;
  2. reads ``partitioned <unix time>`` (the test took the link down then), records when the Router took that server
     out and when each of its generations got its next token from elsewhere, waits for every generation; prints
     ``done <json>``;
  3. reads ``healed <unix time>``, records when the server is routed to again, places new sessions until one lands
     there; prints ``rejoined <json>``.
Every result is checked against what the engines produce (an in-process fake engine of the same config computes
the expected streams): the tokens of the first server up to the cut, then the second server's continuation of
the prompt plus those tokens, nothing lost, nothing repeated.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig

#: Sampled with a seed: a stream is a function of prompt and seed alone, on any server.
PARAMS = {"temperature": 1.0, "seed": 11, "ignore_eos": True}


def _line() -> str:
    return sys.stdin.readline().strip()


def _say(*words: object) -> None:
    print(*words, flush=True)


async def _stream(router: Router, session: str, prompt: list[int], tokens: int, arrivals: list[tuple[float, int]],
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


async def _check(reference: Router, result: GenerateResult, prompt: list[int], tokens: int) -> int:
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


async def main(discovery: str, cut_address: str, sessions: int, tokens: int, vocab_size: int) -> None:
    config = RouterConfig(placement="sticky_least_loaded")
    async with Router.from_discovery_file(discovery, config) as router:
        await router.fleet.wait_ready(min_servers=len(router.fleet.servers), timeout_s=30)
        cut = router.fleet.endpoint(cut_address)
        prompts = {f"s{i}": [100 + i, 7, 7, 7, 9 + i] for i in range(sessions)}
        arrivals: dict[str, list[tuple[float, int]]] = {s: [] for s in prompts}
        results: dict[str, GenerateResult] = {}
        tasks = [asyncio.create_task(_stream(router, s, p, tokens, arrivals[s], results)) for s, p in prompts.items()]
        # 1. every generation under way
        while not all(arrivals.values()):
            await asyncio.sleep(0.02)
        placed = {s: router.session_server(s) for s in prompts}
        _say("streaming", json.dumps(placed))
        # 2. the partition: detection, resumption, completion
        word, at = _line().split()
        assert word == "partitioned", word
        partitioned = float(at)
        detected = None
        while not all(t.done() for t in tasks):
            if detected is None and not cut.healthy:
                detected = time.time()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)  # raises what a generation raised
        resumed = {}  # the first tokens after the server was taken out: the other server's
        for session, marks in arrivals.items():
            later = [t for t, _ in marks if detected is not None and t > detected]
            if placed[session] == cut_address and later:
                resumed[session] = later[0] - partitioned
        engine = await create_server(FakeEngine(FakeEngineConfig(vocab_size=vocab_size)), "127.0.0.1:0")
        await start_adapter(engine)
        try:
            async with Router([f"127.0.0.1:{engine.port}"]) as reference:
                cuts = {s: await _check(reference, results[s], prompts[s], tokens) for s in prompts}
        finally:
            await engine.stop(grace_s=0.1)
        _say("done", json.dumps({
            "detected_s": None if detected is None else detected - partitioned,
            "resumed_s": resumed,
            "tokens": {s: len(r.token_ids) for s, r in results.items()},
            "servers": {s: list(r.servers) for s, r in results.items()},
            "failovers": {s: r.failovers for s, r in results.items()},
            "cut_at": cuts,
        }))
        # 3. the heal: the server rejoins and takes new sessions
        word, at = _line().split()
        assert word == "healed", word
        healed = float(at)
        while not cut.healthy:
            await asyncio.sleep(0.02)
        rejoined = time.time() - healed
        landed, tried = None, 0
        while landed is None and tried < 64:  # concurrent new sessions go to the least loaded: both servers
            batch = await asyncio.gather(*(
                router.generate(GenerateCall(f"new{tried + i}", [5, 6, 7], SamplingParams(max_new_tokens=4)))
                for i in range(4)))
            tried += 4
            landed = next((r.session_id for r in batch if r.servers == (cut_address,)), None)
        _say("rejoined", json.dumps({"rejoined_s": rejoined, "new_session_on_it": landed, "tried": tried}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
