"""Contract: LoadWeights (a safetensors checkpoint the server reads) follows UpdateWeights' rules."""

from __future__ import annotations

import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
from safetensors.numpy import save_file

from agentloop_grpc.common.wire import DTYPES
from agentloop_grpc.v1 import engine_pb2

from .target import ContractTarget, collect, request


def _array(tensor: engine_pb2.TensorChunk) -> np.ndarray:
    return np.frombuffer(tensor.data, dtype=DTYPES[tensor.dtype][0]).reshape(tuple(tensor.shape))


def _checkpoint(folder: Path, tensors: dict[str, np.ndarray], name: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / name))
    return folder / name


async def _load(engine: ContractTarget, path: Path | str, **fields) -> engine_pb2.LoadWeightsResponse:
    return await engine.control.LoadWeights(engine_pb2.LoadWeightsRequest(path=str(path), **fields), timeout=120)


async def test_load_weights_from_a_file_or_a_folder_bumps_the_version(engine: ContractTarget, tmp_path) -> None:
    tensor = engine.sample_tensor
    file = _checkpoint(tmp_path / "step-1", {tensor.name: _array(tensor)})
    before = (await engine.info()).weight_version
    loaded = await _load(engine, file, flush_cache=True)
    assert (loaded.weight_version, loaded.tensors_updated, loaded.bytes_read) == (before + 1, 1, len(tensor.data))
    result = await collect(engine, request(engine, max_new_tokens=3, ignore_eos=True))
    assert result.complete.weight_version == before + 1
    assert {c.weight_version for c in result.chunks} == {before + 1}
    from_folder = await _load(engine, file.parent, weight_version=before + 10)
    assert from_folder.weight_version == before + 10 and from_folder.tensors_updated == 1
    assert (await engine.info()).weight_version == before + 10


@pytest.mark.parametrize(
    "case", ["missing", "empty_folder", "not_safetensors", "deep_header", "long_path", "long_name", "unknown_name",
             "wrong_shape", "old"]
)
async def test_bad_checkpoints_change_nothing(engine: ContractTarget, tmp_path, case: str) -> None:
    tensor = engine.sample_tensor
    value = _array(tensor)
    if case == "unknown_name" and engine.name == "fake":
        pytest.skip("the fake engine has no model: it accepts any tensor name")
    if case == "wrong_shape" and engine.name == "fake":
        pytest.skip("the fake engine has no real parameters to check a shape against")
    before = (await engine.info()).weight_version
    path, needle, code, fields = tmp_path, "", grpc.StatusCode.INVALID_ARGUMENT, {}
    if case == "missing":
        path, needle = tmp_path / "nowhere", "nowhere"
    elif case == "empty_folder":
        needle = "without *.safetensors"
    elif case == "not_safetensors":
        path = tmp_path / "model.safetensors"
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
        needle = "not a safetensors file"
    elif case == "deep_header":  # JSON's decoder recurses per level: this nesting exhausts Python's stack
        path = tmp_path / "model.safetensors"
        header = b"[" * 100_000 + b"]" * 100_000
        path.write_bytes(struct.pack("<Q", len(header)) + header)
        needle = "its header nests more than 3 levels deep"
    elif case == "long_path":  # a megabyte: the OS refuses it (ENAMETOOLONG)
        path, needle = "/" + "a" * (1 << 20), "path has 1048577 bytes; at most 4096 bytes are allowed"
    elif case == "long_name":  # within the path bound, one name beyond the file system's
        path, needle = tmp_path / ("a" * 1000), "cannot be read: File name too long"
    elif case == "unknown_name":
        path = _checkpoint(tmp_path, {tensor.name: value, "model.no_such_weight": value})
        needle = "model.no_such_weight"
    elif case == "wrong_shape":
        path = _checkpoint(tmp_path, {tensor.name: value.reshape(-1)[:-1].copy()})
        needle = tensor.name
    else:
        path = _checkpoint(tmp_path, {tensor.name: value})
        code, fields = grpc.StatusCode.FAILED_PRECONDITION, {"weight_version": before}
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _load(engine, path, **fields)
    assert error.value.code() == code and needle in error.value.details()
    assert (await engine.info()).weight_version == before
