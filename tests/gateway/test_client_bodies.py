"""The coding CLIs as they are: the exact requests Claude Code and Codex CLI sent (captured once, through the gateway
on a scripted engine, at the versions `client_bodies/` names) are read, what the gateway ignores is named, and their
two turns replayed make one token-exact chain. A field a later release adds is accepted and recorded, not refused.
Also: a turn gets the room its context has left, and a turn with none ends with each API's own length stop."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentloop_grpc.agent import ChatCodec
from agentloop_grpc.gateway.anthropic_messages import ANTHROPIC_MESSAGES
from agentloop_grpc.gateway.config import GatewayConfig, GatewayLimits
from agentloop_grpc.gateway.openai_responses import OPENAI_RESPONSES
from agentloop_grpc.gateway.wire import WireFormat

from ..agent.conftest import call
from .conftest import scripted_gateway

BODIES = Path(__file__).parent / "client_bodies"
LIMITS = GatewayLimits()
#: Each client's format, and what its requests hold that the gateway ignores (or leaves out of what the model sees).
CLIENTS: dict[str, tuple[WireFormat, tuple[str, ...]]] = {
    "claude-code-2.1.332": (ANTHROPIC_MESSAGES, (
        "context_management", "messages[].output_config", "tools[].defer_loading")),
    "codex-0.169.0": (OPENAI_RESPONSES, ("client_metadata", "tools[].type=namespace", "tools[].type=web_search")),
}
#: The scripted model's turns: a call of each client's shell tool, then an answer.
CALLS = {
    "claude-code-2.1.332": call("Bash", command="echo fixed > calc.py", description="fix"),
    "codex-0.169.0": call("exec_command", cmd="echo fixed > calc.py"),
}
ANSWER = "Done: calc.py is fixed."


def captured(client: str, turn: int) -> dict[str, Any]:
    return json.loads((BODIES / f"{client}-turn{turn}.json").read_text())


@pytest.mark.parametrize("turn", [1, 2])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_clients_body_is_read_and_what_it_ignores_is_named(client: str, turn: int) -> None:
    fmt, ignored = CLIENTS[client]
    request = fmt.parse(captured(client, turn)["body"], LIMITS)
    assert request.ignored == ignored
    assert request.stream and request.tools
    offered = {t["function"]["name"] for t in request.tools}
    assert ("Bash" if fmt is ANTHROPIC_MESSAGES else "exec_command") in offered
    if fmt is ANTHROPIC_MESSAGES:  # thinking: adaptive asks for a thinking mode SmolLM2's template lacks
        assert request.thinking is True
        assert [m["role"] for m in request.messages[:3]] == ["system", "user", "system"]


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_field_a_later_release_adds_is_accepted_and_recorded(client: str) -> None:
    fmt, ignored = CLIENTS[client]
    body = copy.deepcopy(captured(client, 1)["body"])
    body["session_affinity_2027"] = {"hint": "x"}
    body["tools"].append({"type": "code_interpreter_2027", "container": {"type": "auto"}})
    request = fmt.parse(body, LIMITS)
    assert set(request.ignored) == {*ignored, "session_affinity_2027", "tools[].type=code_interpreter_2027"}
    assert len(request.tools) == len(fmt.parse(captured(client, 1)["body"], LIMITS).tools)


async def _post_streamed(http: httpx.AsyncClient, record: dict[str, Any]) -> str:
    path = record["path"].replace("{id}", "cli")
    async with http.stream("POST", path, json=record["body"], headers=record["headers"]) as reply:
        text = (await reply.aread()).decode()
        assert reply.status_code == 200, text
    return text


@pytest.mark.parametrize("client", list(CLIENTS))
async def test_the_clients_two_turns_replayed_make_one_token_exact_chain(codec, client: str) -> None:
    replies = [CALLS[client], ANSWER]
    async with scripted_gateway(codec, replies, engine={"max_model_len": 65536}) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=60) as http:
        first = await _post_streamed(http, captured(client, 1))
        assert ("tool_use" if "claude" in client else "function_call") in first
        second = await _post_streamed(http, captured(client, 2))
        assert ('"stop_reason":"end_turn"' if "claude" in client else "response.completed") in second
        summary = (await http.get("/sessions/cli")).json()
        assert set(summary["ignored"]) >= set(CLIENTS[client][1]) and summary["forks"] == []
        _, (t,) = await g.gateway.finish("cli")
        seen = [list(r.prompt_ids) for r in g.script.requests]
    assert len(seen) == 2 and t.assistant_turns == 2 and t.tool_calls == 1 and not t.infrastructure_failure
    # token-exact: the first prompt is the trajectory's; the second is the first, the model's tokens and the delta
    assert list(t.prompt_ids) == seen[0]
    ids, mask = list(t.response_ids), list(t.response_mask)
    assert seen[1] == seen[0] + ids[: len(seen[1]) - len(seen[0])]
    model = [i for i, m in zip(ids, mask, strict=True) if m == 1]
    assert [i for i in model if i not in codec.eos_token_ids] == codec.encode(CALLS[client]) + codec.encode(ANSWER)
    assert t.drift is None or t.drift.kind == "tokenization"


async def test_a_turn_gets_the_room_its_context_has_left_and_none_ends_it_with_a_length_stop(codec) -> None:
    short, full = [{"role": "user", "content": "Hi?"}], [{"role": "user", "content": "Hi? " * 4}]
    context = len(codec.prompt_ids(full))  # the engine's max_model_len: the long question fills it
    room = context - len(codec.prompt_ids(short))
    assert 0 < room < 64
    async with scripted_gateway(codec, ["Fine, thank you very much for asking, and you? " * 4], GatewayConfig(),
                                engine={"max_model_len": context}) as g, \
            httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        assert g.router.fleet.max_model_len == context  # each server's GetServerInfo, read when it came up
        chat = (await http.post("/sessions/r1/v1/chat/completions",
                                json={"model": "m", "messages": short, "max_tokens": 64})).json()
        assert g.script.requests[-1].sampling.max_new_tokens == room  # the room left, not 64 nor the 1,024 cap
        assert chat["choices"][0]["finish_reason"] == "length"
        # a prompt that fills the context: the API's own length stop, nothing asked of the engine
        asked = len(g.script.requests)
        messages = (await http.post("/sessions/r2/v1/messages", json={
            "model": "m", "max_tokens": 64, "messages": full})).json()
        assert (messages["stop_reason"], messages["content"]) == ("max_tokens", [])
        assert len(g.script.requests) == asked


#: ChatML with a thinking mode, as Qwen3's template has one: the assistant turn opens with <think> when it is on.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}"
)


async def test_thinking_switches_a_templates_thinking_mode_and_is_recorded_where_there_is_none(codec) -> None:
    thinking = ChatCodec(codec.tokenizer, THINKING_TEMPLATE)
    assert thinking.thinking_switch and not codec.thinking_switch
    question = [{"role": "user", "content": "Hi?"}]
    ask = {"model": "m", "max_tokens": 16, "messages": question}
    async with scripted_gateway(thinking, ["Fine."]) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        for session, mode in (("t1", {"type": "adaptive"}), ("t2", {"type": "disabled"}), ("t3", None)):
            body = {**ask, **({"thinking": mode} if mode else {})}
            assert (await http.post(f"/sessions/{session}/v1/messages", json=body)).status_code == 200
        prompts = [codec.decode(r.prompt_ids) for r in g.script.requests]
        assert [p.endswith("<|im_start|>assistant\n<think>\n") for p in prompts] == [True, False, False]
        assert (await http.get("/sessions/t1")).json()["ignored"] == {}
        # a chain keeps the mode it started with: a request asking for the other one forks
        reply = (await http.post("/sessions/t1/v1/messages", json={**ask, "messages": [
            *question, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "Sure?"}]})).json()
        assert reply["agentloop"]["forked"] is True
    async with scripted_gateway(codec, ["Fine."]) as g, httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        assert (await http.post("/sessions/t4/v1/messages", json={**ask, "thinking": {"type": "adaptive"}})).is_success
        assert (await http.get("/sessions/t4")).json()["ignored"] == {"thinking": 1}
        metrics = (await http.get("/metrics")).text
        assert 'agentloop_gateway_ignored_fields_total{field="thinking"} 1.0' in metrics
