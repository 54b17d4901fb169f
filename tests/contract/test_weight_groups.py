"""Contract: weight-transfer groups (JoinWeightGroup, ReceiveWeights, LeaveWeightGroup) follow UpdateWeights'
rules, with the bytes broadcast over torch.distributed (gloo) from a leader this test plays (rank 0)."""

from __future__ import annotations

import asyncio
import math
import socket
import uuid

import grpc
import pytest

from agentloop_grpc.common.weight_group import WeightGroupLeader
from agentloop_grpc.common.weight_layout import BucketLayout, TensorSpec, WeightGroupSpec
from agentloop_grpc.common.wire import DTYPES
from agentloop_grpc.v1 import engine_pb2

from .target import ContractTarget, collect, request

BUCKET = 1 << 20


class Leader:
    """The trainer's side of a one-server group, run from the test."""

    def __init__(self, engine: ContractTarget) -> None:
        self.engine = engine
        self.name = f"contract-{uuid.uuid4().hex[:8]}"
        self.leader: WeightGroupLeader | None = None

    async def __aenter__(self) -> Leader:
        ranks = (await self.engine.info()).weight_group_ranks
        store, port = await asyncio.to_thread(WeightGroupLeader.host, "127.0.0.1", 1 + ranks, 60)
        spec = WeightGroupSpec(self.name, "127.0.0.1", port, 1 + ranks, 0, "gloo", 60)
        forming = asyncio.ensure_future(asyncio.to_thread(WeightGroupLeader.form, store, spec))
        joined = await self.engine.control.JoinWeightGroup(engine_pb2.JoinWeightGroupRequest(
            group_name=self.name, master_address="127.0.0.1", master_port=port, world_size=1 + ranks,
            rank_offset=1, backend="gloo", timeout_s=60,
        ), timeout=90)
        assert list(joined.ranks) == list(range(1, 1 + ranks))
        self.leader = await forming
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.engine.control.LeaveWeightGroup(engine_pb2.LeaveWeightGroupRequest(group_name=self.name), timeout=30)
        await asyncio.to_thread(self.leader.close)

    async def push(self, tensors: list[engine_pb2.TensorChunk], **fields) -> engine_pb2.ReceiveWeightsResponse:
        specs = [TensorSpec(t.name, DTYPES[t.dtype][0], tuple(t.shape)) for t in tensors]
        layout = BucketLayout.of(specs, BUCKET)
        announced = [engine_pb2.TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape) for t in tensors]
        receiving = asyncio.ensure_future(self.engine.control.ReceiveWeights(engine_pb2.ReceiveWeightsRequest(
            group_name=self.name, tensors=announced, bucket_bytes=BUCKET, **fields
        ), timeout=120))

        def send() -> None:
            if self.leader.vote(True):
                self.leader.send(layout, [t.data for t in tensors])

        await asyncio.to_thread(send)
        return await receiving


async def test_updates_over_a_group_bump_the_version_and_the_group_survives(engine: ContractTarget) -> None:
    tensor = engine.sample_tensor
    before = (await engine.info()).weight_version
    async with Leader(engine) as leader:
        for step in (1, 2, 3):
            answer = await leader.push([tensor], flush_cache=True)
            assert (answer.weight_version, answer.tensors_updated) == (before + step, 1)
            assert answer.bytes_received == len(tensor.data)
        result = await collect(engine, request(engine, max_new_tokens=3, ignore_eos=True))
        assert result.complete.weight_version == before + 3
        assert {c.weight_version for c in result.chunks} == {before + 3}
        explicit = await leader.push([tensor], weight_version=before + 10)
        assert explicit.weight_version == before + 10
    assert (await engine.info()).weight_version == before + 10


@pytest.mark.parametrize("case", ["unknown_name", "wrong_shape", "old_version"])
async def test_a_refused_update_changes_nothing_and_the_group_stays_usable(engine: ContractTarget, case: str) -> None:
    tensor = engine.sample_tensor
    if case in ("unknown_name", "wrong_shape") and engine.name == "fake":
        pytest.skip("the fake engine has no model: it accepts any tensor")
    before = (await engine.info()).weight_version
    bad, fields, code, needle = tensor, {}, grpc.StatusCode.INVALID_ARGUMENT, ""
    if case == "unknown_name":
        bad = engine_pb2.TensorChunk(name="no.such.weight", dtype=tensor.dtype, shape=tensor.shape, data=tensor.data)
        needle = "no.such.weight"
    elif case == "wrong_shape":
        bad = engine_pb2.TensorChunk(name=tensor.name, dtype=tensor.dtype, shape=[len(tensor.data) // 4, 1],
                                     data=tensor.data)
        needle = tensor.name
    else:
        fields, code, needle = {"weight_version": before}, grpc.StatusCode.FAILED_PRECONDITION, "greater"
    async with Leader(engine) as leader:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await leader.push([bad], **fields)
        assert refused.value.code() == code and needle in refused.value.details()
        assert (await engine.info()).weight_version == before
        assert (await leader.push([tensor])).weight_version == before + 1  # the group did not break


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "case", ["backend", "rank_offset", "world_size", "port", "timeout_nan", "timeout_inf", "timeout_negative",
             "no_leader"]
)
async def test_a_group_that_cannot_form_is_a_clear_error(engine: ContractTarget, case: str) -> None:
    port = _free_port()
    fields = {"group_name": "g", "master_address": "127.0.0.1", "master_port": port, "world_size": 2, "rank_offset": 1,
                  "backend": "gloo", "timeout_s": 1}
    code, needle = grpc.StatusCode.INVALID_ARGUMENT, case
    if case == "backend":
        fields["backend"] = "mpi"
    elif case == "rank_offset":
        fields["rank_offset"] = 0
        needle = "rank 0 is the trainer's"
    elif case == "world_size":
        fields["world_size"] = 1
        needle = "world_size"
    elif case == "port":
        fields["master_port"] = 70000
        needle = "master_port"
    elif case.startswith("timeout_"):  # NaN passes a `<= 0` check: it must be named, not waited on
        fields["timeout_s"] = {"timeout_nan": math.nan, "timeout_inf": math.inf, "timeout_negative": -1.0}[case]
        needle = f"timeout_s = {fields['timeout_s']} must be finite and in (0, 86400.0] seconds"
    else:
        code, needle = grpc.StatusCode.UNAVAILABLE, f"127.0.0.1:{port}"
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await engine.control.JoinWeightGroup(engine_pb2.JoinWeightGroupRequest(**fields), timeout=60)
    assert failed.value.code() == code and needle in failed.value.details()
    result = await collect(engine, request(engine, max_new_tokens=2, ignore_eos=True))  # still serving
    assert result.complete.completion_tokens == 2


@pytest.mark.parametrize("case", ["unknown_group", "no_tensors", "bucket", "dtype"])
async def test_bad_announcements_are_refused_before_anything_moves(engine: ContractTarget, case: str) -> None:
    tensor = engine.sample_tensor
    spec = engine_pb2.TensorSpec(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape)
    fields = {"group_name": "never-joined", "tensors": [spec], "bucket_bytes": BUCKET}
    needle = {"unknown_group": "never-joined", "no_tensors": "tensors", "bucket": "bucket_bytes",
              "dtype": "tensors[0].dtype"}[case]
    if case == "no_tensors":
        fields["tensors"] = []
    elif case == "bucket":
        fields["bucket_bytes"] = 1024
    elif case == "dtype":
        fields["tensors"] = [engine_pb2.TensorSpec(name=tensor.name, shape=tensor.shape)]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await engine.control.ReceiveWeights(engine_pb2.ReceiveWeightsRequest(**fields), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in refused.value.details()
    await engine.control.LeaveWeightGroup(engine_pb2.LeaveWeightGroupRequest(group_name="never-joined"), timeout=10)


async def test_a_broadcast_cut_short_leaves_the_group_and_the_server_serving(engine: ContractTarget) -> None:
    tensor = engine.sample_tensor
    before = (await engine.info()).weight_version
    leader = Leader(engine)
    await leader.__aenter__()
    announced = [engine_pb2.TensorSpec(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape)]
    receiving = asyncio.ensure_future(engine.control.ReceiveWeights(engine_pb2.ReceiveWeightsRequest(
        group_name=leader.name, tensors=announced, bucket_bytes=BUCKET,
    ), timeout=120))
    assert await asyncio.to_thread(leader.leader.vote, True)
    await asyncio.to_thread(leader.leader.close)  # the trainer goes away before sending a byte
    with pytest.raises(grpc.aio.AioRpcError) as cut:
        await receiving
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE and "join the group again" in cut.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as gone:  # the server left the broken group
        await engine.control.ReceiveWeights(engine_pb2.ReceiveWeightsRequest(
            group_name=leader.name, tensors=announced, bucket_bytes=BUCKET,
        ), timeout=30)
    assert gone.value.code() == grpc.StatusCode.INVALID_ARGUMENT and leader.name in gone.value.details()
    assert (await engine.info()).weight_version == before
    result = await collect(engine, request(engine, max_new_tokens=2, ignore_eos=True))
    assert result.complete.completion_tokens == 2
    async with Leader(engine) as again:  # and joins a new group as before
        assert (await again.push([tensor])).weight_version == before + 1
