"""Reading safetensors checkpoints for LoadWeights: what safetensors writes is read back byte for byte, and every
malformed file is refused with the file and tensor named."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.engine_adapters.checkpoint import checkpoint_specs, read_checkpoint


def test_a_folder_of_files_reads_back_every_tensor(tmp_path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2], dtype=np.int64)
    save_file({"a": a}, str(tmp_path / "model-00001.safetensors"))
    save_file({"b": b}, str(tmp_path / "model-00002.safetensors"))
    save_torch({"c": torch.ones(3, dtype=torch.bfloat16)}, str(tmp_path / "model-00003.safetensors"))
    (tmp_path / "notes.txt").write_text("not a checkpoint: ignored")
    tensors, read = read_checkpoint(str(tmp_path))
    by_name = {t.name: t for t in tensors}
    assert (by_name["a"].dtype, by_name["a"].shape, by_name["a"].data) == ("float32", (2, 3), a.tobytes())
    assert (by_name["b"].dtype, by_name["b"].data) == ("int64", b.tobytes())
    assert (by_name["c"].dtype, by_name["c"].shape, len(by_name["c"].data)) == ("bfloat16", (3,), 6)
    assert read == 24 + 16 + 6


def _raw(path, header: dict, data: bytes) -> None:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


@pytest.mark.parametrize(
    ("header", "data", "needle"),
    [
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(8), "do not hold shape"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4), "do not hold shape"),
        ({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "unsupported or malformed"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, bytes(4), "do not hold shape"),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_tensor(tmp_path, header, data, needle) -> None:
    _raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(InvalidRequestError, match=needle):
        read_checkpoint(str(tmp_path / "bad.safetensors"))


def test_a_header_longer_than_the_file_and_duplicates_across_files_are_refused(tmp_path) -> None:
    (tmp_path / "short.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(InvalidRequestError, match="a header of 1000 bytes"):
        read_checkpoint(str(tmp_path / "short.safetensors"))
    folder = tmp_path / "dup"
    folder.mkdir()
    for name in ("one", "two"):
        save_file({"w": np.zeros(1, dtype=np.float32)}, str(folder / f"{name}.safetensors"))
    with pytest.raises(InvalidRequestError, match="'w' is in more than one file"):
        read_checkpoint(str(folder))


def test_specs_are_read_from_the_headers_alone(tmp_path) -> None:
    save_file({"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.int64)}, str(tmp_path / "m.safetensors"))
    specs, total = checkpoint_specs(str(tmp_path))
    assert sorted((s.name, s.dtype, s.shape) for s in specs) == [("a", "float32", (2, 3)), ("b", "int64", (4,))]
    assert total == 2 * 3 * 4 + 4 * 8
