"""The manager moves weights by path (one checkpoint the engines load) when the engines share this machine, by
stream otherwise or when told; either way every engine takes the update's version."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, WorkerSpec
from agentloop_grpc.agent.weight_transfer import choose_weight_transfer
from agentloop_grpc.common.addresses import is_loopback
from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import NamedTensor

from .conftest import TextScript, scripted_engine

TENSORS = [NamedTensor("w", "float32", (2,), b"\0" * 8), NamedTensor("b", "bfloat16", (1,), b"\0\0")]


@pytest.mark.parametrize(("kind", "expected"), [("auto", "path"), ("stream", "stream"), ("path", "path")])
async def test_updates_reach_every_engine_by_the_chosen_transfer(codec, caplog, tmp_path, kind, expected) -> None:
    script = TextScript(codec, ["hi"])
    weights_dir = str(tmp_path) if kind == "path" else None
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(scripted_engine(script)) for _ in range(2)]
        with caplog.at_level(logging.INFO, logger="agentloop_grpc.agent.weight_transfer"):
            manager = await stack.enter_async_context(AgentLoopManager(
                WorkerSpec(engines=tuple(engines), weight_transfer=kind, weights_dir=weights_dir)
            ))
        assert manager.weight_transfer == expected
        assert any(f"by {expected}" in r.getMessage() for r in caplog.records)
        await manager.control.wait_ready(2)
        await manager.update_weights(TENSORS, weight_version=3)
        infos = (await manager.control.server_info()).raise_for_errors().responses
        assert {info.weight_version for info in infos.values()} == {3}
        assert manager.control.weight_version == 3
        if kind == "path":
            assert list(tmp_path.iterdir()) == []  # each checkpoint is removed once loaded


def test_auto_takes_path_only_when_every_engine_is_on_this_machine(tmp_path) -> None:
    assert is_loopback("127.0.0.1:5") and is_loopback("localhost:5") and is_loopback("[::1]:5")
    assert not is_loopback("10.0.0.2:5") and not is_loopback("node-3:5")
    assert choose_weight_transfer("auto", ["127.0.0.1:1", "10.0.0.2:1"]).name == "stream"
    assert choose_weight_transfer("auto", ["10.0.0.2:1"], str(tmp_path)).name == "path"  # shared storage given


def test_a_written_checkpoint_is_what_safetensors_reads(tmp_path) -> None:
    from safetensors.torch import load_file

    tensors = [NamedTensor("w", "float32", (2,), b"\x00\x00\x80\x3f\x00\x00\x00\x40")]
    assert write_safetensors(tmp_path / "c.safetensors", tensors) == 8
    assert load_file(str(tmp_path / "c.safetensors"))["w"].tolist() == [1.0, 2.0]
