"""The safetensors file format, as both sides of LoadWeights need it: the trainer's side writes a checkpoint of
NamedTensors, the engine server reads one (``engine_adapters/checkpoint.py``).

A file is an 8-byte little-endian header length, a JSON header of name -> dtype, shape and byte range, then the
data. Written here without a framework, so the client side needs neither torch nor the safetensors package.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

from .types import NamedTensor

#: safetensors dtype -> (our dtype name, bytes per element).
SAFETENSORS_DTYPES = {
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F64": ("float64", 8),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
_CODES = {name: code for code, (name, _size) in SAFETENSORS_DTYPES.items()}


def write_safetensors(path: Path, tensors: Sequence[NamedTensor]) -> int:
    """Write ``tensors`` as one safetensors file at ``path``; return the data bytes written."""
    header, offset = {}, 0
    for tensor in tensors:
        if tensor.dtype not in _CODES:
            raise ValueError(f"tensor {tensor.name!r}: dtype {tensor.dtype!r} has no safetensors code")
        header[tensor.name] = {
            "dtype": _CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(tensor.data)],
        }
        offset += len(tensor.data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for tensor in tensors:
            file.write(tensor.data)
    return offset
