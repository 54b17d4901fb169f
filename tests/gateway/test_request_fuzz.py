"""A seeded, bounded fuzz of every gateway route with random and structured bodies and session ids: nothing is a
5xx, every error is JSON in its route's own shape, and the gateway is healthy and answers a turn after. Small in
``make test`` (GATEWAY_FUZZ_CASES cases, at most GATEWAY_FUZZ_SECONDS); ``AGENTLOOP_GATEWAY_FUZZ_CASES`` and
``AGENTLOOP_GATEWAY_FUZZ_SEED`` run a longer or another one by hand."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
from typing import Any

import httpx
import pytest

from agentloop_grpc.gateway.config import GatewayConfig, GatewayLimits

from .conftest import scripted_gateway

pytestmark = pytest.mark.fault

GATEWAY_FUZZ_CASES = int(os.environ.get("AGENTLOOP_GATEWAY_FUZZ_CASES", "300"))
GATEWAY_FUZZ_SECONDS = float(os.environ.get("AGENTLOOP_GATEWAY_FUZZ_SECONDS", "10"))
SEED = int(os.environ.get("AGENTLOOP_GATEWAY_FUZZ_SEED", "58"))

QUESTION = [{"role": "user", "content": "Hi?"}]
#: Per route (method, path with {id}, valid body or None, whose error shape): the bodies the fuzz mutates.
ROUTES: list[tuple[str, str, Any, str]] = [
    ("POST", "/sessions/{id}/v1/chat/completions", {"model": "m", "messages": QUESTION, "max_tokens": 8}, "openai"),
    ("POST", "/sessions/{id}/v1/responses", {"model": "m", "input": "Hi?", "max_output_tokens": 16}, "openai"),
    ("POST", "/sessions/{id}/v1/messages", {"model": "m", "max_tokens": 8, "messages": QUESTION}, "anthropic"),
    ("GET", "/sessions/{id}/v1/models", None, "openai"),
    ("POST", "/sessions", {"session_id": "{id}", "group_id": "g", "metadata": {"k": "v"}}, "openai"),
    ("GET", "/sessions", None, "openai"),
    ("GET", "/sessions/{id}", None, "openai"),
    ("POST", "/sessions/{id}/reward", {"reward": 1.0, "metrics": {"acc": 1.0}}, "openai"),
    ("POST", "/sessions/{id}/finish", {}, "openai"),
    ("GET", "/health", None, "openai"),
]
#: Session ids as sent in a path: good ones (reused, so turns, rewards and finishes meet) and hostile ones.
SESSION_IDS = ["f1", "f2", "f3", "abc%0A", "%2E%2E", "a%2Fb", "x" * 129, "%F0%9F%98%80", "%ED%A0%80", "a:b.c-d_e"]
TEXT_PIECES = ["Hi", "\ud800", "\udfff", "\ud83d\ude00", "\x00", "\n", "\u202e", "<|im_end|>", "ß", "{", "\"", "é" * 50]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(TEXT_PIECES) for _ in range(rng.randint(0, 6)))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**70), 10**400])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, 1e-320, float("inf"), float("nan")])
    if kind in (4, 5):
        return random_text(rng)
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["role", "content", "type", "text", "messages", "model", "stream", "tools", random_text(rng)]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def same_kind(rng: random.Random, body: Any) -> Any:
    """``body`` with one leaf replaced by another of its kind (text by hostile text, a number by an odd one), so
    the rest stays valid and what is odd reaches the gateway's inside."""
    body = copy.deepcopy(body)
    leaves: list[tuple[Any, Any]] = []
    stack = [body]
    while stack:
        holder = stack.pop()
        for key in (list(holder) if isinstance(holder, dict) else range(len(holder))):
            child = holder[key]
            (stack.append(child) if isinstance(child, (dict, list)) else leaves.append((holder, key)))
    if leaves:
        holder, key = rng.choice(leaves)
        leaf = holder[key]
        holder[key] = rng.choice(TEXT_PIECES[1:3]) + random_text(rng) if isinstance(leaf, str) else rng.choice(
            [0, -1, 2**63, 10**400, 1e308, float("nan"), 0.5])
    return body


def mutated(rng: random.Random, body: Any) -> Any:
    """``body`` with one to three of its values replaced, removed or added at random places."""
    if rng.random() < 0.4:
        return same_kind(rng, body)
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        holder, key = body, None
        while isinstance(holder, (dict, list)) and holder and rng.random() < 0.7:
            key = rng.choice(list(holder)) if isinstance(holder, dict) else rng.randrange(len(holder))
            if not isinstance(holder[key], (dict, list)) or not holder[key]:
                break
            holder, key = holder[key], None
        if not isinstance(holder, (dict, list)):
            return random_value(rng)
        action = rng.randrange(3)
        if action == 0 and key is not None:
            del holder[key]
        elif isinstance(holder, dict):
            holder[key if key is not None and action == 1 else rng.choice(["stream", "n", "tools", random_text(rng)])] \
                = random_value(rng)
        elif key is not None:
            holder[key] = random_value(rng)
        else:
            holder.append(random_value(rng))
    return body


def random_body(rng: random.Random, valid: Any, session_id: str) -> bytes | None:
    roll = rng.random()
    if valid is not None and roll < 0.6:
        text = json.dumps(mutated(rng, valid) if roll < 0.5 else valid).replace("{id}", session_id)
        return text.encode()
    if roll < 0.7:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if roll < 0.8:
        return json.dumps(valid or {"a": 1}).encode()[: rng.randint(0, 20)]  # truncated
    if roll < 0.9:
        return None
    return json.dumps(random_value(rng)).encode()


def assert_error_shape(shape: str, reply: httpx.Response, case: tuple) -> None:
    assert reply.headers["content-type"].startswith("application/json"), (case, reply.text)
    body = reply.json()
    if shape == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["type"], str), (case, body)
        assert isinstance(body["error"]["message"], str), (case, body)
    else:
        assert isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str), (case, body)


async def test_a_seeded_fuzz_of_every_route_gets_no_5xx_and_only_errors_in_the_routes_shape(codec):
    rng = random.Random(SEED)
    limits = GatewayLimits(max_body_bytes=64 * 1024)
    async with scripted_gateway(codec, lambda prompt: "Ok.", GatewayConfig(limits=limits)) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + GATEWAY_FUZZ_SECONDS
        statuses: dict[int, int] = {}
        for index in range(GATEWAY_FUZZ_CASES):
            if loop.time() > stop_at:
                break
            # the model turns and good ids most often: there the body reaches furthest in
            method, template, valid, shape = rng.choices(ROUTES, [4, 4, 4] + [1] * (len(ROUTES) - 3))[0]
            session_id = rng.choice(SESSION_IDS[:3] if rng.random() < 0.6 else SESSION_IDS)
            body = random_body(rng, valid, session_id) if method == "POST" else None
            case = (index, method, template, session_id, body[:200] if body else body)
            headers = {"content-type": "application/json"} if rng.random() < 0.9 else {"content-type": "text/plain"}
            reply = await http.request(method, template.replace("{id}", session_id), content=body, headers=headers)
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
            assert reply.status_code < 500, (case, reply.text)
            if reply.status_code >= 400:
                assert_error_shape(shape, reply, case)
        assert sum(statuses.values()) >= min(GATEWAY_FUZZ_CASES, 100), statuses  # it ran, not just started
        assert statuses.get(200, 0) and sum(n for s, n in statuses.items() if s >= 400), statuses
        assert (await http.get("/health")).json() == {"status": "ok"}
        good = await http.post("/sessions/after/v1/chat/completions", json={"model": "m", "messages": QUESTION})
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "Ok."
