"""The manager moves weights by collective (one broadcast to every engine) when the group forms, else by path (one
checkpoint the engines load) when the engines share this machine, by stream otherwise or when told; either way
every engine takes the update's version."""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, WorkerSpec
from agentloop_grpc.agent.weight_transfer import CollectiveTransfer, local_address_towards
from agentloop_grpc.common.addresses import is_loopback
from agentloop_grpc.common.safetensors_format import write_safetensors
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.router import Fleet, RouterConfig

from .conftest import TextScript, scripted_engine

TENSORS = [NamedTensor("w", "float32", (2,), b"\0" * 8), NamedTensor("b", "bfloat16", (1,), b"\0\0")]


@pytest.mark.parametrize(
    ("kind", "expected"), [("auto", "collective"), ("collective", "collective"), ("stream", "stream"), ("path", "path")]
)
async def test_updates_reach_every_engine_by_the_chosen_transfer(codec, caplog, tmp_path, kind, expected) -> None:
    script = TextScript(codec, ["hi"])
    weights_dir = str(tmp_path) if kind == "path" else None
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(scripted_engine(script)) for _ in range(2)]
        manager = await stack.enter_async_context(AgentLoopManager(
            WorkerSpec(engines=tuple(engines), weight_transfer=kind, weights_dir=weights_dir)
        ))
        assert manager.weight_transfer == kind  # chosen at the first update
        await manager.control.wait_ready(2)
        with caplog.at_level(logging.INFO, logger="agentloop_grpc.agent.weight_transfer"):
            for version in (3, 4):  # a second update reuses what the first chose (the group, if one)
                await manager.update_weights(TENSORS, weight_version=version)
        assert manager.weight_transfer == expected
        assert sum(f"by {expected}" in r.getMessage() for r in caplog.records) == 1
        # the servers of one update are never held out for each other (the first to answer is not ahead)
        assert not [r.getMessage() for r in caplog.records if "held out" in r.getMessage()]
        infos = (await manager.control.server_info()).raise_for_errors().responses
        assert {info.weight_version for info in infos.values()} == {4}
        assert manager.control.weight_version == 4
        if kind == "path":
            assert list(tmp_path.iterdir()) == []  # each checkpoint is removed once loaded


async def test_auto_falls_back_to_path_when_no_group_can_form(codec, caplog) -> None:
    script = TextScript(codec, ["hi"])
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(scripted_engine(script)) for _ in range(2)]
        # an address that is not this machine's: the rendezvous cannot be hosted there
        spec = WorkerSpec(engines=tuple(engines), weight_group_address="192.0.2.1")
        manager = await stack.enter_async_context(AgentLoopManager(spec))
        await manager.control.wait_ready(2)
        with caplog.at_level(logging.INFO, logger="agentloop_grpc.agent.weight_transfer"):
            await manager.update_weights(TENSORS, weight_version=1)
        assert manager.weight_transfer == "path"
        assert any("no weight group" in r.getMessage() and "192.0.2.1" in r.getMessage() for r in caplog.records)


def test_the_group_address_is_the_one_on_the_route_to_the_engines() -> None:
    assert is_loopback("127.0.0.1:5") and is_loopback("localhost:5") and is_loopback("[::1]:5")
    assert not is_loopback("10.0.0.2:5") and not is_loopback("node-3:5")
    assert local_address_towards("127.0.0.1:5") == "127.0.0.1"
    assert not is_loopback(f"{local_address_towards('192.0.2.1:5')}:5")  # a documentation address: routed out


def test_a_written_checkpoint_is_what_safetensors_reads(tmp_path) -> None:
    from safetensors.torch import load_file

    tensors = [NamedTensor("w", "float32", (2,), b"\x00\x00\x80\x3f\x00\x00\x00\x40")]
    assert write_safetensors(tmp_path / "c.safetensors", tensors) == 8
    assert load_file(str(tmp_path / "c.safetensors"))["w"].tolist() == [1.0, 2.0]


async def test_a_stopped_server_leaves_the_group_and_the_next_update_fails_fast(codec) -> None:
    """A server that stops leaves its group, so the next broadcast fails at once (no wait for the group's
    timeout), the survivors leave too, and the update after it forms a new group with the servers that answer."""
    script = TextScript(codec, ["hi"])
    async with AsyncExitStack() as stack:
        live = await stack.enter_async_context(scripted_engine(script))
        stopping = AsyncExitStack()
        doomed = await stopping.enter_async_context(scripted_engine(script))
        control = await stack.enter_async_context(Fleet([live, doomed], RouterConfig(control_timeout_s=10)))
        await control.wait_ready(2)
        transfer = CollectiveTransfer("127.0.0.1", timeout_s=60)
        stack.push_async_callback(transfer.close, control)
        for version in (1, 2):
            (await transfer.push(control, TENSORS, version)).raise_for_errors()
        group = transfer.group
        await stopping.aclose()
        started = time.monotonic()
        failed = await transfer.push(control, TENSORS, 3)
        assert time.monotonic() - started < 30  # well inside the group's 60 s timeout
        assert doomed in failed.errors
        assert transfer.group is None  # the broken group was let go
        await control.remove_server(doomed)
        (await transfer.push(control, TENSORS, 4)).raise_for_errors()  # a new group, of the one that answers
        assert transfer.members == frozenset({live}) and transfer.group != group
        infos = (await control.server_info()).raise_for_errors().responses
        assert infos[live].weight_version == 4
