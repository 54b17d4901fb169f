"""Malformed and oversized requests get a 4xx in the API's own error shape, naming the field and the bound; the
gateway stays healthy and other sessions go on. Also tokens, the session TTL, the paused answer and the budget."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import openai
import pytest

from agentloop_grpc.common.types import PauseMode
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig, GatewayLimits

from .conftest import scripted_gateway

pytestmark = pytest.mark.fault

QUESTION = [{"role": "user", "content": "Hi?"}]


async def post(client: httpx.AsyncClient, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return await client.post(path, content=content, headers={"content-type": "application/json", **(headers or {})})


async def raw_http(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """``request`` sent as bytes on a new connection, read until the server closes it: status, headers, body."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


async def test_malformed_requests_are_4xx_naming_the_field_and_the_gateway_goes_on(codec):
    limits = GatewayLimits(max_body_bytes=1_000_000, max_messages=100)
    async with scripted_gateway(codec, ["Fine."], GatewayConfig(limits=limits)) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        chat = "/sessions/h1/v1/chat/completions"
        cases = [
            (b"{not json", 400, None),
            ({"model": "m", "messages": QUESTION, "n": 2}, 400, "n"),
            ({"model": "m", "messages": QUESTION, "temperature": 7}, 400, "temperature"),
            ({"model": "m", "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
            ({"model": "m", "messages": QUESTION, "seed": -1}, 400, "seed"),
            ({"model": "m", "messages": []}, 400, "messages"),
            ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
            ({"model": "m", "messages": QUESTION * 101}, 400, "messages"),
            ({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]}, 400,
             "messages[0].content[0].image_url.url"),
            ({"model": "m", "messages": QUESTION, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "objekt"}}}]}, 400, "tools[0]"),
            ({"model": "m", "messages": QUESTION, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object"}}}], "tool_choice": {
                "type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
            ([1, 2, 3], 400, None),
        ]
        for body, status, param in cases:
            reply = await post(http, chat, body)
            assert reply.status_code == status, (body, reply.text)
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error", (body, error)
            assert error["param"] == param or error["param"].startswith(f"{param}."), (body, error)
        too_big = await post(http, chat, b"x" * 2_000_000)
        assert too_big.status_code == 413 and "max_body_bytes=1000000" in too_big.json()["error"]["message"]
        many = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 100_000}
        assert (await post(http, chat, many)).status_code == 413  # 100k messages are past the body bound too
        assert (await post(http, "/sessions/bad id/v1/chat/completions", {"messages": QUESTION})).status_code == 400
        assert (await post(http, "/sessions/nobody/finish", {})).status_code == 404
        assert (await http.get("/sessions/nobody")).status_code == 404
        # still healthy, and a good request is answered
        assert (await http.get("/health")).json() == {"status": "ok"}
        good = await post(http, chat, {"model": "m", "messages": QUESTION})
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "Fine."
        metrics = (await http.get("/metrics")).text
        assert 'agentloop_gateway_requests_total{api="chat_completions",status="400"}' in metrics


async def test_tokens_guard_model_turns_and_the_admin_token_guards_session_control(codec):
    async with scripted_gateway(codec, ["Yes."], user_token="user-t", admin_token="admin-t") as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        with pytest.raises(openai.AuthenticationError):
            await g.openai("t1", api_key="wrong").chat.completions.create(
                model="m", messages=QUESTION)
        reply = await g.openai("t1", api_key="user-t").chat.completions.create(
            model="m", messages=QUESTION)
        assert reply.choices[0].message.content == "Yes."
        user, admin = {"authorization": "Bearer user-t"}, {"authorization": "Bearer admin-t"}
        assert (await http.get("/sessions", headers=user)).status_code == 401
        listed = (await http.get("/sessions", headers=admin)).json()["sessions"]
        assert [s["session_id"] for s in listed] == ["t1"]
        assert (await post(http, "/sessions/t1/reward", {"reward": 1.5}, headers=admin)).json()["reward"] == 1.5
        finished = (await post(http, "/sessions/t1/finish", {}, headers=admin)).json()
        (trajectory,) = finished["trajectories"]
        assert trajectory["reward"] == 1.5 and trajectory["response_mask"][-1] == 1
        assert (await http.get("/health")).status_code == 200  # no token for health


async def test_sessions_are_created_with_metadata_and_expire_after_their_ttl(codec):
    limits = GatewayLimits(session_ttl_s=0.5, max_sessions=2)
    async with scripted_gateway(codec, ["Ok."], GatewayConfig(limits=limits)) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        created = (await post(http, "/sessions", {"session_id": "m1", "sample_id": "row-7", "group_id": "g7",
                                                  "ground_truth": "42", "row": {"q": 1}})).json()
        assert (created["sample_id"], created["group_id"]) == ("row-7", "g7")
        assert (await post(http, "/sessions", {"session_id": "m1"})).status_code == 409
        assert (await post(http, "/sessions", {"session_id": "m2", "colour": "red"})).status_code == 400
        await post(http, "/sessions", {"session_id": "m2"})
        assert (await post(http, "/sessions", {"session_id": "m3"})).status_code == 429  # max_sessions
        g.gateway.sessions.sweep(now=float("inf"))  # as if the TTL had passed
        assert len(g.gateway.sessions) == 0 and g.gateway.sessions.expired == 2
        assert (await post(http, "/sessions", {"session_id": "m3"})).status_code == 200


async def test_a_session_with_a_request_in_flight_outlives_its_ttl(codec):
    """The TTL counts from a session's last request; one whose turn is still generating (held here by paused
    engines) is not dropped under it, and the turn lands in the session when it ends."""
    async with scripted_gateway(codec, ["Ok."], GatewayConfig(limits=GatewayLimits(session_ttl_s=0.5))) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        (await g.router.fleet.pause(PauseMode.KEEP)).raise_for_errors()
        held = asyncio.create_task(post(http, "/sessions/t1/v1/chat/completions", {"model": "m", "messages": QUESTION}))
        async with asyncio.timeout(30):
            while not (len(g.gateway.sessions) and g.gateway.sessions.get("t1").in_flight):
                await asyncio.sleep(0.01)
        assert g.gateway.sessions.sweep(now=float("inf")) == 0  # as if the TTL had passed
        (await g.router.fleet.resume()).raise_for_errors()
        assert (await held).status_code == 200
        _, (trajectory,) = await g.gateway.finish("t1")
    assert trajectory.assistant_turns == 1 and not trajectory.failed


async def test_paused_engines_answer_503_with_retry_after_when_configured(codec):
    """The trainer pauses the engines through the Router the gateway generates with (a weight update, as
    ``update_weights_mid_rollout`` does): ``retry`` answers 503 until the resume; ``wait`` holds the request."""
    config = GatewayConfig(when_paused="retry", retry_after_s=2.0)
    async with scripted_gateway(codec, ["Ok."], config) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        (await g.router.fleet.pause(PauseMode.KEEP)).raise_for_errors()
        reply = await post(http, "/sessions/p1/v1/chat/completions", {"model": "m", "messages": QUESTION})
        assert reply.status_code == 503 and reply.headers["retry-after"] == "2"
        assert "paused for a weight update" in reply.json()["error"]["message"]
        (await g.router.fleet.resume()).raise_for_errors()
        assert (await post(http, "/sessions/p1/v1/chat/completions",
                           {"model": "m", "messages": QUESTION})).status_code == 200
    async with scripted_gateway(codec, ["Ok."]) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        (await g.router.fleet.pause(PauseMode.KEEP)).raise_for_errors()
        held = asyncio.create_task(post(http, "/sessions/p2/v1/chat/completions", {"model": "m", "messages": QUESTION}))
        await asyncio.sleep(0.3)
        assert not held.done()  # the engine holds it while paused
        (await g.router.fleet.resume()).raise_for_errors()
        assert (await held).status_code == 200


async def test_forced_sampling_and_the_response_budget_hold_whatever_the_agent_asks(codec):
    long_reply = "word " * 40
    config = GatewayConfig(sampling=ForcedSampling(temperature=0.0, top_p=0.5, max_tokens_per_turn=16,
                                                   response_budget=30))
    async with scripted_gateway(codec, [long_reply], config) as g:
        client = g.openai("b1")
        first = await client.chat.completions.create(model="m", messages=QUESTION, temperature=1.5, top_p=0.2,
                                                      max_tokens=500)
        assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 16
        sampling = g.script.requests[-1].sampling
        assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (0.0, 0.5, 16)
        history = [*QUESTION, first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "user", "content": "More."}]
        second = await client.chat.completions.create(model="m", messages=history)
        assert second.choices[0].finish_reason == "length" and second.usage.completion_tokens < 16
        # the budget spent, a third turn is not generated
        history += [second.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
        third = await client.chat.completions.create(model="m", messages=history)
        assert third.choices[0].finish_reason == "length" and third.usage.completion_tokens == 0
        _session, (t,) = await g.gateway.finish("b1")
    # the first turn's 16, the user turn's delta, and the second turn to the budget's end exactly
    assert len(t.response_ids) == 30 and t.termination.value == "length" and t.assistant_turns == 2


async def test_session_ids_are_checked_whole_in_one_place_and_path_like_ids_are_refused(codec):
    """A final newline passed ``re.match`` in the route and failed when the session was made (a 500); ``.`` and
    ``..`` read as paths. Each is a 400 in the route's own shape, and POST /sessions agrees."""
    async with scripted_gateway(codec, ["Ok."]) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        for session_id in ["abc%0A", "abc%0D%0A", "a" * 129]:
            chat = await post(http, f"/sessions/{session_id}/v1/chat/completions", {"model": "m", "messages": QUESTION})
            assert chat.status_code == 400, (session_id, chat.text)
            assert chat.json()["error"]["param"] == "session_id"
            messages = await post(http, f"/sessions/{session_id}/v1/messages",
                                  {"model": "m", "max_tokens": 8, "messages": QUESTION})
            assert messages.status_code == 400 and messages.json()["type"] == "error", (session_id, messages.text)
        for session_id in [".", "..", "%2E%2E"]:  # as sent: httpx would resolve them away
            body = json.dumps({"model": "m", "messages": QUESTION}).encode()
            status, _, answer = await raw_http(g.url, b"POST /sessions/%s/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                                               b"content-type: application/json\r\ncontent-length: %d\r\n"
                                               b"connection: close\r\n\r\n%s" % (session_id.encode(), len(body), body))
            assert status == 400 and json.loads(answer)["error"]["param"] == "session_id", (session_id, answer)
        for session_id in ["nl\n", ".", "..", ""]:
            created = await post(http, "/sessions", {"session_id": session_id})
            assert created.status_code == 400 and created.json()["error"]["param"] == "session_id", created.text
        assert len(g.gateway.sessions) == 0
        assert (await post(http, "/sessions", {"session_id": "a.b:c-1_"})).status_code == 200


async def test_a_lone_surrogate_or_an_endless_integer_is_a_400_naming_its_path_on_every_api(codec):
    """Valid JSON that nothing downstream can hold: a lone surrogate reached the tokenizer (a TypeError, 500);
    a 5000-digit reward was called "not valid JSON". Each is refused where the body is decoded."""
    async with scripted_gateway(codec, ["Ok."]) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        lone = '{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"\\ud800x"}]}'
        for route in ["chat/completions", "messages"]:
            reply = await post(http, f"/sessions/s1/v1/{route}", lone)
            assert reply.status_code == 400, (route, reply.text)
            body = reply.json()
            message = body["error"]["message"]
            assert message.startswith("messages[0].content: ") and "Unicode" in message, body
            assert body["error"]["param"] == "messages[0].content" if route == "chat/completions" else \
                body["type"] == "error"
        responses = await post(http, "/sessions/s1/v1/responses", '{"model":"m","input":"\\udfffx"}')
        assert responses.status_code == 400 and responses.json()["error"]["param"] == "input", responses.text
        key = await post(http, "/sessions", '{"session_id":"s2","metadata":{"\\ud800":"x"}}')
        assert key.status_code == 400 and key.json()["error"]["param"] == "metadata", key.text
        await post(http, "/sessions", {"session_id": "s3"})
        huge = await post(http, "/sessions/s3/reward", '{"reward": ' + "9" * 5000 + "}")
        assert huge.status_code == 400 and huge.json()["error"]["param"] == "reward", huge.text
        assert "5000 digits" in huge.json()["error"]["message"] and "JSON" not in huge.json()["error"]["message"]
        assert (await post(http, "/sessions/s3/reward", {"reward": 10**40})).status_code == 200
        emoji = await post(http, "/sessions/s1/v1/chat/completions",  # a surrogate pair is one valid character
                           '{"model":"m","messages":[{"role":"user","content":"\\ud83d\\ude00"}]}')
        assert emoji.status_code == 200, emoji.text


async def trickled(url: str, head: bytes, drip: bytes, every_s: float = 0.05) -> tuple[bytes, float]:
    """Send ``head``, then ``drip`` every ``every_s`` for as long as the server keeps the connection open: what it
    answered and after how many seconds it closed."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    start = asyncio.get_running_loop().time()

    async def drip_on() -> None:
        writer.write(head)
        while True:
            await asyncio.sleep(every_s)
            writer.write(drip)

    dripping = asyncio.create_task(drip_on())
    try:
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        dripping.cancel()
        writer.close()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await dripping
    return answer, asyncio.get_running_loop().time() - start


async def test_slow_and_idle_clients_are_closed_and_the_connection_bound_holds(codec):
    """A client trickling its headers or body, or sending nothing, held its connection for ever (50 of them for
    30 s in the issue): each phase has its deadline, a timed-out request gets a 408 in its route's shape, and
    past max_connections a connection is closed as it is accepted."""
    limits = GatewayLimits(header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=0.5, max_connections=8,
                           max_header_bytes=1024)
    async with scripted_gateway(codec, ["Ok."], GatewayConfig(limits=limits)) as g:
        head = b"POST /sessions/s1/v1/messages HTTP/1.1\r\nhost: x\r\n"
        answer, took = await trickled(g.url, head, b"x-slow: 1\r\n")
        assert answer.startswith(b"HTTP/1.1 408 ") and 0.4 < took < 3, (answer, took)
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["type"] == "invalid_request_error"
        body_head = b"POST /sessions/s1/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 9999\r\n\r\n{"
        answer, took = await trickled(g.url, body_head, b" ")
        assert answer.startswith(b"HTTP/1.1 408 ") and 0.4 < took < 3, (answer, took)
        assert "body_timeout_s=0.5" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"]
        # a route that never reads its body answers at once; the trickled rest is still cut off
        answer, took = await trickled(g.url, b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 9999\r\n\r\n", b" ")
        assert answer.startswith(b"HTTP/1.1 200 ") and 0.4 < took < 3, (answer, took)
        answer, took = await trickled(g.url, b"", b"", every_s=10)  # connects and says nothing
        assert answer == b"" and 0.4 < took < 3, took
        # the parser's own refusals are in the route's shape too
        status, headers, body = await raw_http(g.url, b"POST /sessions/s1/v1/messages HTTP/1.1\r\nhost: x\r\n"
                                               b"content-length: -5\r\n\r\n")
        assert status == 400 and headers["content-type"] == "application/json", body
        assert json.loads(body)["type"] == "error"
        # headers past max_header_bytes: a 431 (httptools alone kept 50 MB of them)
        status, _, body = await raw_http(g.url, b"POST /sessions/s1/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                                         + b"x-big: %s\r\n\r\n" % (b"a" * 4000))
        assert status == 431 and "max_header_bytes=1024" in json.loads(body)["error"]["message"], body
        # max_connections: 8 open (idle), the 9th is closed at once, well before the idle timeout
        host, port = g.url.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(8)]
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            start = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(reader.read(), 30) == b""
            assert asyncio.get_running_loop().time() - start < 0.3
            writer.close()
        finally:
            for _, w in held:
                w.close()
        async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            unrouted = await http.get("/sessions/s1/v1/messages")  # 405, in Anthropic's shape
            assert unrouted.status_code == 405 and unrouted.json()["type"] == "error", unrouted.text
            missing = await http.get("/nowhere")
            assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
