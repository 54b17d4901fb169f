"""The gateway records a MoE model's routed experts on its trajectories (GatewayConfig.return_routed_experts): two
turns through the HTTP API on the fake engine standing in for a MoE model, every input position's routing."""

from __future__ import annotations

import httpx

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.router import GenerateCall

from .conftest import scripted_gateway

MOE = {"routed_expert_layers": 3, "routed_experts_per_token": 2, "num_experts": 16}


async def test_a_two_turn_session_carries_the_routing_of_every_input_position(codec):
    config = GatewayConfig(return_routed_experts=True)
    async with scripted_gateway(codec, ["It is 5.", "Yes, 5."], config, engine=MOE) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=60) as http:
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        for follow_up in ("Are you sure?", None):
            reply = (await http.post("/sessions/m1/v1/chat/completions", json={
                "model": "m", "messages": messages, "max_tokens": 20})).json()
            messages += [reply["choices"][0]["message"]]
            if follow_up:
                messages += [{"role": "user", "content": follow_up}]
        _, (t,) = await g.gateway.finish("m1")
        ids = [*t.prompt_ids, *t.response_ids]
        # the fake's routing is a function of each position's token: a prompt of the whole sequence reports the rows
        whole = await g.router.generate(GenerateCall("check", [*ids[:-1], 1], SamplingParams(
            max_new_tokens=1, return_routed_experts=True)))
    assert t.assistant_turns == 2 and 0 in t.response_mask
    routing = t.routed_experts
    assert routing is not None and routing.positions == len(ids) - 1
    assert whole.routed_experts is not None and routing.ids == whole.routed_experts.prompt
