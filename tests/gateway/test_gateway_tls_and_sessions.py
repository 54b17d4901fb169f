"""HTTPS with real certificates (made in the test), and a session's own forced sampling over the gateway's."""

from __future__ import annotations

import ssl

import httpx
import openai
import pytest

from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from .conftest import scripted_gateway

QUESTION = [{"role": "user", "content": "Hi?"}]


def trusting(ca) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def test_https_with_a_certificate_the_client_verifies(codec, pki):
    async with scripted_gateway(codec, ["Secure."], tls=(str(pki.server_cert), str(pki.server_key)),
                                user_token="t") as g:
        assert g.url.startswith("https://127.0.0.1:")
        verified = g.openai("tls1", api_key="t",
                                      http_client=openai.DefaultAsyncHttpxClient(verify=trusting(pki.ca)))
        reply = await verified.chat.completions.create(model="m", messages=QUESTION)
        assert reply.choices[0].message.content == "Secure."
        # a client that trusts another authority does not connect
        untrusted = g.openai("tls1", api_key="t", max_retries=0,
                                       http_client=openai.DefaultAsyncHttpxClient(verify=trusting(pki.rogue_ca)))
        with pytest.raises(openai.APIConnectionError):
            await untrusted.chat.completions.create(model="m", messages=QUESTION)


async def test_a_sessions_forced_sampling_holds_over_the_gateways(codec):
    config = GatewayConfig(sampling=ForcedSampling(temperature=1.0, max_tokens_per_turn=64))
    async with scripted_gateway(codec, ["Greedy."], config) as g, httpx.AsyncClient(base_url=g.url) as http:
        created = await http.post("/sessions", json={"session_id": "v1", "sampling": {
            "temperature": 0.0, "max_tokens_per_turn": 8}})
        assert created.status_code == 200
        client = g.openai("v1")
        await client.chat.completions.create(model="m", messages=QUESTION, temperature=0.9)
        sampling = g.script.requests[-1].sampling
        assert (sampling.temperature, sampling.max_new_tokens) == (0.0, 8)
        await g.openai("other").chat.completions.create(
            model="m", messages=QUESTION, temperature=0.9)
        sampling = g.script.requests[-1].sampling
        assert (sampling.temperature, sampling.max_new_tokens) == (1.0, 64)  # the gateway's, for the others
