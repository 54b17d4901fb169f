"""LoadWeights and weight groups on SGLang: checkpoints go to SGLang's ``update_weights_from_disk``, broadcasts
are received by the rank-0 actor over a real gloo group and loaded with ``update_weights_from_tensor``; the
stand-in's parameters show what was applied."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from safetensors.numpy import save_file

from agentloop_grpc.common.weight_layout import BucketLayout, TensorSpec, WeightGroupError
from agentloop_grpc.v1 import engine_pb2

from ..contract.target import ContractTarget, request
from ..contract.test_weight_groups import BUCKET, Leader
from .conftest import sglang_server, standin_group

pytestmark = pytest.mark.usefixtures("ray_cluster")

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
SHAPES = {"model.norm.weight": (2, 2), "lm_head.weight": (3, 5)}
ZEROS = {name: [0.0] * int(np.prod(shape)) for name, shape in SHAPES.items()}


def _tensor(name: str, values: np.ndarray) -> engine_pb2.TensorChunk:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return engine_pb2.TensorChunk(name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=values.shape,
                                  data=values.tobytes())


def _values(step: float) -> dict[str, np.ndarray]:
    return {name: np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + step for name, shape in SHAPES.items()}


@pytest.fixture(scope="module")
async def served(ray_cluster):
    """A TP group of 2 behind one gRPC server, the stand-in holding two parameters; yields (target, group)."""
    async with standin_group(tp_size=2, token_latency_s=0.005, parameter_shapes=SHAPES) as group:
        async with sglang_server(group) as server:
            address = f"127.0.0.1:{server.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                sample = _tensor("model.norm.weight", np.ones((2, 2)))
                yield ContractTarget("sglang", address, channel, PROMPT, 400, sample), group


@pytest.fixture
async def target(served):
    target, group = served
    await group.recorder.clear.remote()
    yield target
    await target.wait_no_requests()


@pytest.fixture
def group(served):
    return served[1]


async def _weights(group, count: int = 1) -> dict[str, list[float]]:
    """The parameters the stand-in holds after its ``count``-th applied update."""
    found = await group.calls("weights", count)
    assert len(found) == count, f"{len(found)} updates applied, expected {count}"
    return found[-1]


def _as_lists(values: dict[str, np.ndarray]) -> dict[str, list[float]]:
    return {name: value.flatten().tolist() for name, value in values.items()}


# -- LoadWeights ------------------------------------------------------------------------------------------------


async def test_load_weights_from_a_file_goes_to_sglangs_disk_loader(target, group, tmp_path) -> None:
    values = _values(1.0)
    file = tmp_path / "step-1.safetensors"
    save_file(values, str(file))
    before = (await target.info()).weight_version
    loaded = await target.control.LoadWeights(engine_pb2.LoadWeightsRequest(path=str(file), flush_cache=True),
                                              timeout=60)
    assert (loaded.weight_version, loaded.tensors_updated) == (before + 1, 2)
    assert loaded.bytes_read == sum(v.nbytes for v in values.values())
    (call,) = await group.calls("update_weights_from_disk")
    assert call["load_format"] == "safetensors" and call["flush_cache"] and call["weight_version"] == str(before + 1)
    assert call["model_path"] != str(file)  # SGLang loads folders: the file was handed over in one of its own
    assert await _weights(group) == _as_lists(values)


async def test_load_weights_from_a_folder_passes_the_folder(target, group, tmp_path) -> None:
    values = _values(7.0)
    save_file({"model.norm.weight": values["model.norm.weight"]}, str(tmp_path / "a.safetensors"))
    save_file({"lm_head.weight": values["lm_head.weight"]}, str(tmp_path / "b.safetensors"))
    loaded = await target.control.LoadWeights(engine_pb2.LoadWeightsRequest(path=str(tmp_path)), timeout=60)
    assert loaded.tensors_updated == 2
    (call,) = await group.calls("update_weights_from_disk")
    assert call["model_path"] == str(tmp_path) and not call["flush_cache"]
    assert await _weights(group) == _as_lists(values)


@pytest.mark.parametrize("case", ["unknown_name", "wrong_shape"])
async def test_a_checkpoint_sglang_refuses_is_invalid_and_named(target, group, tmp_path, case) -> None:
    values = _values(3.0)
    if case == "unknown_name":
        values["model.no_such_weight"] = values["model.norm.weight"]
        needle = "model.no_such_weight"
    else:
        values["lm_head.weight"] = values["lm_head.weight"].reshape(5, 3)
        needle = "lm_head.weight"
    save_file(values, str(tmp_path / "model.safetensors"))
    before = (await target.info()).weight_version
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await target.control.LoadWeights(engine_pb2.LoadWeightsRequest(path=str(tmp_path)), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SGLang refused the checkpoint" in refused.value.details() and needle in refused.value.details()
    assert (await target.info()).weight_version == before
    assert len(await group.calls("update_weights_from_disk")) == 1
    assert await group.calls("weights", timeout_s=0.5) == []


# -- weight groups ----------------------------------------------------------------------------------------------


async def test_server_info_offers_one_rank_whatever_the_tp_size(target) -> None:
    assert (await target.info()).weight_group_ranks == 1


async def test_broadcast_updates_reach_the_engine_and_the_group_survives(target, group) -> None:
    async with Leader(target) as leader:
        for step in (1, 2, 3):
            values = _values(10.0 * step)
            answer = await leader.push([_tensor(n, v) for n, v in values.items()], flush_cache=step == 2)
            assert answer.tensors_updated == 2
            assert await _weights(group, step) == _as_lists(values)
        calls = await group.calls("update_weights_from_tensor", 3)
        assert [c["ranks"] for c in calls] == [2, 2, 2]  # one receive, loaded into both TP ranks
        assert [c["flush_cache"] for c in calls] == [False, True, False]


async def test_a_mismatched_tensor_is_named_and_nothing_is_applied(target, group) -> None:
    before = (await target.info()).weight_version
    good = _tensor("model.norm.weight", np.full((2, 2), 5.0))
    bad = _tensor("lm_head.weight", np.zeros((5, 3)))
    async with Leader(target) as leader:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await leader.push([good, bad])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "lm_head.weight" in refused.value.details()
        assert (await target.info()).weight_version == before
        assert await group.calls("weights", timeout_s=0.5) == []  # not even the good tensor
        values = _values(2.0)
        await leader.push([_tensor(n, v) for n, v in values.items()])  # the group still works
        assert await _weights(group) == _as_lists(values)


async def test_generation_goes_on_while_the_broadcast_is_awaited(target, group) -> None:
    values = _values(4.0)
    tensors = [_tensor(n, v) for n, v in values.items()]
    async with Leader(target) as leader:
        stream = target.generate.Generate(request(target, max_new_tokens=400, ignore_eos=True), timeout=60)
        await stream.read()
        announced = [engine_pb2.TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape) for t in tensors]
        receiving = asyncio.ensure_future(target.control.ReceiveWeights(engine_pb2.ReceiveWeightsRequest(
            group_name=leader.name, tensors=announced, bucket_bytes=BUCKET), timeout=60))
        await asyncio.sleep(0.2)  # the actor now waits for the leader's vote
        for _ in range(10):  # tokens keep coming meanwhile
            await asyncio.wait_for(stream.read(), timeout=5)
        assert not receiving.done()
        layout = BucketLayout.of([TensorSpec(t.name, "float32", tuple(t.shape)) for t in tensors], BUCKET)

        def send() -> None:
            assert leader.leader.vote(True)
            leader.leader.send(layout, [t.data for t in tensors])

        await asyncio.to_thread(send)
        assert (await receiving).tensors_updated == 2
        stream.cancel()
    assert await _weights(group) == _as_lists(values)


async def test_the_group_is_left_when_the_server_stops(ray_cluster) -> None:
    async with standin_group(tp_size=1, parameter_shapes=SHAPES) as group:
        async with sglang_server(group) as server:
            address = f"127.0.0.1:{server.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                target = ContractTarget("sglang", address, channel, PROMPT, 400, engine_pb2.TensorChunk())
                leader = await Leader(target).__aenter__()
                await leader.push([_tensor("model.norm.weight", np.ones((2, 2)))])
        # the server stopped: its actor left, so the trainer's next collective fails instead of waiting 60 s
        started = time.monotonic()
        with pytest.raises(WeightGroupError):
            await asyncio.to_thread(leader.leader.vote, True)
        assert time.monotonic() - started < 30
        await asyncio.to_thread(leader.leader.close)
