"""The fake engine standing in for a MoE model: its routing through the Router, across a resumed abort."""

from __future__ import annotations

from agentloop_grpc.common import routed_experts
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig

from .conftest import address, fake_servers

MOE = {"routed_expert_layers": 4, "routed_experts_per_token": 2, "num_experts": 300}  # 300: uint16 ids
FAST = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)


def _rows(routing: bytes) -> list[list[list[int]]]:
    return routed_experts.unpack(routing, 4, 2, 300).tolist()


async def test_a_resumed_generation_keeps_every_tokens_routing() -> None:
    """The generation is aborted mid-stream and resumed from the tokens received (the next attempt's prompt holds
    them): the call's routing is the first attempt's tokens', then the second's, and the prompt's own positions
    only; a
    prompt of the whole sequence reports the same rows (the fake's routing is a function of token and position)."""
    prompt = [11, 12, 13, 14, 15]
    sampling = SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True, return_routed_experts=True)
    async with fake_servers(1, token_latency_s=0.005, **MOE) as servers, Router(
            [address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(1)
        received, result = 0, None
        async for event in router.stream(GenerateCall("s", prompt, sampling, max_resumes=1)):
            if isinstance(event, GenerateResult):
                result = event
                break
            received += len(event.token_ids)
            if received == 5:  # a weight update's Pause(ABORT) does the same
                assert (await router.abort("s")).ok
        assert result is not None and result.resumes == 1 and len(result.servers) == 2
        assert len(result.token_ids) == 40
        routing = result.routed_experts
        assert routing is not None and len(routing.prompt) == (len(prompt) - 1) * routing.row_bytes
        whole = prompt + list(result.token_ids)
        again = await router.generate(GenerateCall("t", whole[:-1] + [1], SamplingParams(
            max_new_tokens=1, temperature=0, return_routed_experts=True)))
    assert again.routed_experts is not None
    assert _rows(routing.prompt + routing.tokens) == _rows(again.routed_experts.prompt)
    assert len(set(routed_experts.unpack(routing.tokens, 4, 2, 300).reshape(-1).tolist())) > 20
