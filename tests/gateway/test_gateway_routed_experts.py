"""The gateway records a MoE model's routed experts on its trajectories (GatewayConfig.return_routed_experts): two
turns through the HTTP API on the fake engine standing in for a MoE model, every input position's routing; an
engine that cannot report routing (a dense model's) is refused when the gateway starts, or at the first request
when none had answered by then, never turn by turn."""

from __future__ import annotations

import httpx
import pytest

from agentloop_grpc.agent.routing_check import RoutingUnavailableError
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.gateway.config import GatewayConfig
from agentloop_grpc.router import GenerateCall

from ..agent.conftest import TextScript, scripted_engine
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


def _refused(address: str) -> str:
    return f"return_routed_experts is set but {address} cannot report routed experts"


async def test_agentloop_gateway_refuses_an_engine_without_routing_before_it_serves(codec):
    from agentloop_grpc.gateway.serve import serve_gateway

    def served(url: str) -> None:
        raise AssertionError(f"the gateway served at {url} over an engine without routing")

    async with scripted_engine(TextScript(codec, ["It is 5."])) as address:
        with pytest.raises(RoutingUnavailableError, match=_refused(address)):
            await serve_gateway(GatewayConfig(return_routed_experts=True), [address], "127.0.0.1", 0,
                                on_listening=served)


async def test_a_gateway_none_answered_at_its_start_refuses_the_first_request_not_each_turn(codec):
    async with scripted_gateway(codec, ["It is 5."], GatewayConfig(return_routed_experts=True)) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=60) as http:
        reply = await http.post("/sessions/m1/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 20})
        assert reply.status_code == 502 and reply.json()["error"]["code"] == "infrastructure"
        assert reply.json()["error"]["message"].startswith(_refused(g.engine))
        assert len(g.gateway.sessions) == 0  # refused before a session was made
