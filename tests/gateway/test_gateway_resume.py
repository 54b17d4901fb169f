"""A gateway turn aborted by a weight update (Pause ABORT) is resumed by the Router, by the one rule our loops' turns
follow too (router/attempts.py): the tokens so far as prompt, a seed of its own for the resume (the gateway used to
send the turn's seed again, so a resumed turn replayed the random stream it had already used)."""

from __future__ import annotations

import asyncio

import httpx

from agentloop_grpc.common.types import PauseMode
from agentloop_grpc.router.attempts import resume_seed

from .conftest import scripted_gateway

REPLY = "one two three four five six seven eight nine ten " * 3


async def test_an_aborted_turn_resumes_with_its_tokens_and_a_seed_of_its_own(codec):
    async with scripted_gateway(codec, [REPLY], engine={"token_latency_s": 0.01}) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=60) as http:
        turn = asyncio.create_task(http.post("/sessions/r1/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "Count."}], "seed": 11, "max_tokens": 200}))
        while not g.script.requests:  # the script records what the engine got: no event to wait on
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # some tokens decoded
        (await g.router.fleet.pause(PauseMode.ABORT)).raise_for_errors()
        (await g.router.fleet.resume()).raise_for_errors()
        reply = (await turn).json()
        _, (t,) = await g.gateway.finish("r1")
    first, second = g.script.requests
    assert (first.sampling.seed, second.sampling.seed) == (11, resume_seed(11, 1))
    assert len(second.prompt_ids) > len(first.prompt_ids)  # the tokens so far, as prompt
    assert reply["choices"][0]["finish_reason"] == "stop"
    model = [i for i, m in zip(t.response_ids, t.response_mask, strict=True) if m]
    assert model[:-1] == codec.encode(REPLY) and t.resumed_generations == 1  # nothing lost, nothing twice
