"""The loops' tokenizer must be the engines': a mismatch is refused before the first rollout, with the server
and both tokenizers named."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, Sample, WorkerSpec
from agentloop_grpc.agent.tokenizer_check import TokenizerMismatchError, check_engine_tokenizers
from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint
from agentloop_grpc.router import ServerInfo
from agentloop_grpc.router.replies import server_info
from agentloop_grpc.v1 import engine_pb2

from .conftest import TextScript, scripted_engine


def info(**fields) -> ServerInfo:
    defaults = {"engine_kind": "embedded", "model_id": "m", "vocab_size": 49_152,
                "state": engine_pb2.ENGINE_STATE_RUNNING}
    return server_info(engine_pb2.GetServerInfoResponse(**{**defaults, **fields}))


def test_same_fingerprint_passes_and_another_is_refused(codec):
    ours = tokenizer_fingerprint(codec.tokenizer)
    assert check_engine_tokenizers(codec.tokenizer, {"a:1": info(tokenizer_fingerprint=ours)}, None) == 1
    with pytest.raises(TokenizerMismatchError, match=r"b:2 serves 'qwen' .* the default model"):
        check_engine_tokenizers(codec.tokenizer, {"a:1": info(tokenizer_fingerprint=ours),
                                                  "b:2": info(model_id="qwen", tokenizer_fingerprint="sha256:0")}, None)


def test_engines_without_a_tokenizer_are_checked_on_the_vocabulary(codec):
    fake = info(engine_kind="fake", tokenizer_fingerprint="fake-vocab-49152")
    assert check_engine_tokenizers(codec.tokenizer, {"f:1": fake}, None) == 1
    with pytest.raises(TokenizerMismatchError, match="vocabulary of 1000 ids"):
        check_engine_tokenizers(codec.tokenizer, {"f:1": info(engine_kind="fake", vocab_size=1000)}, "/models/x")
    loading = info(state=engine_pb2.ENGINE_STATE_LOADING, vocab_size=0)
    assert check_engine_tokenizers(codec.tokenizer, {"l:1": loading}, None) == 0


async def test_manager_refuses_an_engine_with_another_vocabulary(codec):
    script = TextScript(codec, ["hello"])
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(scripted_engine(script, vocab_size=1000))
        manager = await stack.enter_async_context(AgentLoopManager(WorkerSpec(engines=(engine,))))
        await manager.control.wait_ready()
        with pytest.raises(TokenizerMismatchError, match="vocabulary of 1000 ids"):
            await manager.generate([Sample(sample_id="a", loop="single_turn",
                                           messages=({"role": "user", "content": "hi"},))])
    assert not script.requests  # nothing was sent to the engine
