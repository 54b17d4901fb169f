"""Agent-loop fixtures: the real tokenizer and chat template, a real fake-engine server on loopback whose replies
are scripted as text (encoded with the real tokenizer, so the loop sees exactly what a model would send), the real
built-in tools, and a Router in between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from agentloop_grpc.agent import AgentLoopConfig, ChatCodec, LoopContext, LoopRegistry
from agentloop_grpc.agent.interaction import RetryOnWrongAnswer
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.common.types import GenerateRequest
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.tools.builtin.calculator import calculator
from agentloop_grpc.tools.builtin.check_answer import CheckAnswer
from agentloop_grpc.tools.client import InProcessToolClient
from agentloop_grpc.tools.instances import InstanceManager
from agentloop_grpc.tools.tool import FunctionTool

VOCAB = 49_152  # SmolLM2's
EOS = 2  # <|im_end|>


@pytest.fixture(scope="session")
def codec() -> ChatCodec:
    return load_codec(None)


class TextScript:
    """The scripted model: reply ``replies[i]`` to the i-th assistant turn of a conversation (the last reply
    repeats), ``split`` optionally forces a token split of a reply (to produce non-canonical tokenizations)."""

    def __init__(self, codec: ChatCodec, replies: Sequence[str] | Callable[[str], str]) -> None:
        self.codec = codec
        self.replies = replies
        self.requests: list[GenerateRequest] = []

    def __call__(self, request: GenerateRequest) -> list[int]:
        self.requests.append(request)
        text = self.codec.decode(request.prompt_ids)
        if callable(self.replies):
            reply = self.replies(text)
        else:
            turn = text.count("<|im_start|>assistant") - 1
            reply = self.replies[min(turn, len(self.replies) - 1)]
        ids = reply_ids(self.codec, reply)
        # a resumed generation (after an abort) continues the reply from the tokens the prompt already has
        opener = self.codec.encode("<|im_start|>assistant\n")
        prompt = list(request.prompt_ids)
        starts = [i + len(opener) for i in range(len(prompt) - len(opener) + 1)
                  if prompt[i : i + len(opener)] == opener]
        produced = prompt[starts[-1]:] if starts else []
        return ids[len(produced):] if produced and ids[: len(produced)] == produced else ids


def reply_ids(codec: ChatCodec, reply: str | list[int]) -> list[int]:
    return list(reply) if isinstance(reply, list) else codec.encode(reply)


def call(name: str, **arguments) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def local_tools() -> InProcessToolClient:
    return InProcessToolClient(InstanceManager({"calculator": FunctionTool(calculator), "check_answer": CheckAnswer()}))


@asynccontextmanager
async def scripted_engine(script: Callable[[GenerateRequest], Sequence[int]], **config) -> AsyncIterator[str]:
    engine = FakeEngine(FakeEngineConfig(**{"vocab_size": VOCAB, "eos_token_id": EOS, "script": script, **config}))
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(grace_s=1)


@asynccontextmanager
async def loop_context(
    codec: ChatCodec, replies, config: AgentLoopConfig | None = None, tools=None, engine: dict | None = None,
    **context,
) -> AsyncIterator[tuple[LoopContext, LoopRegistry, TextScript]]:
    """A scripted engine behind a Router, with the given loop config, and the registry of the default loops."""
    script = TextScript(codec, replies)
    async with AsyncExitStack() as stack:
        address = await stack.enter_async_context(scripted_engine(script, **(engine or {})))
        router = await stack.enter_async_context(Router([address], RouterConfig(no_server_wait_s=1)))
        await router.fleet.wait_ready()
        if tools is None:
            tools = local_tools()
            stack.push_async_callback(tools.close)  # its function tools' worker processes
        specs = {s.name: s for s in await tools.list_tools()}
        ctx = LoopContext(
            generator=router, codec=codec, config=config or AgentLoopConfig(), tools=tools, tool_specs=specs,
            interactions={"retry": RetryOnWrongAnswer(max_attempts=3)}, **context,
        )
        yield ctx, LoopRegistry.default(ctx), script


class WatchedRouter:
    """The Router, watched: counts the tokens streamed to each session and records every result."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.tokens: dict[str, int] = {}
        self.results: list[GenerateResult] = []
        self.changed = asyncio.Event()

    async def generate(self, call: GenerateCall) -> GenerateResult:
        async for event in self.router.stream(call):
            if isinstance(event, GenerateResult):
                self.results.append(event)
                return event
            self.tokens[call.session_id] = self.tokens.get(call.session_id, 0) + len(event.token_ids)
            self.changed.set()
        raise AssertionError("no result")

    def close_session(self, session_id: str) -> None:
        self.router.close_session(session_id)

    async def wait(self, predicate) -> None:
        while not predicate():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=120)
