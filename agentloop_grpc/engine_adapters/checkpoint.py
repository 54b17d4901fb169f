"""Reading a safetensors checkpoint that LoadWeights names, into the same NamedTensors UpdateWeights delivers.

The format (``common/safetensors_format.py``) is parsed here, so no framework is needed and every adapter gets the
update the same way. Files are memory-mapped: only the tensors' bytes are read, once, from the page cache.
Everything is checked before an adapter sees a byte, so a bad checkpoint changes nothing in the engine.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import Any

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.safetensors_format import SAFETENSORS_DTYPES
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.common.weight_layout import TensorSpec

from . import validation

#: A safetensors header larger than this is refused (the format's own limit).
MAX_HEADER_BYTES = 100 * 1024 * 1024


def checkpoint_files(path: str) -> list[Path]:
    """The safetensors files ``path`` names: the file itself, or a folder's ``*.safetensors`` (not recursive)."""
    if not path:
        raise InvalidRequestError("path is required (a safetensors file or a folder of them, as the server sees it)")
    validation.check_path(path)
    where = Path(path)
    try:
        is_file, is_dir = where.is_file(), where.is_dir()
    except OSError as error:  # is_file answers False only for a path that does not exist
        raise validation.unreadable_path(path, error) from error
    if is_file:
        return [where]
    if is_dir:
        files = sorted(where.glob("*.safetensors"))
        if not files:
            raise InvalidRequestError(f"path {path!r} is a folder without *.safetensors files")
        return files
    raise InvalidRequestError(f"path {path!r} is neither a file nor a folder this server can read")


def read_checkpoint(path: str) -> tuple[list[NamedTensor], int]:
    """Every tensor in the checkpoint at ``path``, and their bytes in all; InvalidRequestError names what is wrong."""
    tensors: dict[str, NamedTensor] = {}
    for file in checkpoint_files(path):
        for tensor in _read_file(file, with_data=True):
            if tensor.name in tensors:
                raise InvalidRequestError(f"tensor {tensor.name!r} is in more than one file under {path!r}")
            tensors[tensor.name] = tensor
    return list(tensors.values()), sum(len(t.data) for t in tensors.values())


def checkpoint_entries(path: str) -> list[tuple[Path, TensorSpec]]:
    """``read_checkpoint`` without the bytes: each tensor's file, name, dtype and shape, from the headers checked the
    same way, for engines that load the files themselves."""
    entries: dict[str, tuple[Path, TensorSpec]] = {}
    for file in checkpoint_files(path):
        for tensor in _read_file(file, with_data=False):
            if tensor.name in entries:
                raise InvalidRequestError(f"tensor {tensor.name!r} is in more than one file under {path!r}")
            entries[tensor.name] = file, TensorSpec(tensor.name, tensor.dtype, tensor.shape)
    return list(entries.values())


def checkpoint_specs(path: str) -> tuple[list[TensorSpec], int]:
    """The checkpoint's tensors (``checkpoint_entries``) and their bytes in all."""
    specs = [spec for _file, spec in checkpoint_entries(path)]
    return specs, sum(spec.nbytes for spec in specs)


def read_header(file: Path) -> dict[str, dict]:
    """The tensor entries (name -> dtype, shape, byte range) of a safetensors file's header, checked as
    ``read_checkpoint`` checks it; no tensor byte is read."""
    with _mapped(file) as mapped:
        header, _start = _header(file, mapped)
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def _read_file(file: Path, with_data: bool) -> list[NamedTensor]:
    """The file's tensors (empty ``data`` unless ``with_data``: mapping reads no bytes until they are sliced)."""
    with _mapped(file) as mapped:
        header, start = _header(file, mapped)
        return [
            _tensor(file, mapped, start, name, entry, with_data) for name, entry in header.items()
            if name != "__metadata__"
        ]


def _mapped(file: Path) -> mmap.mmap:
    try:
        handle = file.open("rb")
    except OSError as error:
        raise validation.unreadable_path(str(file), error) from error
    with handle:
        try:
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as error:  # an empty file cannot be mapped
            raise InvalidRequestError(f"{file} is not a safetensors file: {error}") from error


def _header(file: Path, mapped: mmap.mmap) -> tuple[dict, int]:
    if len(mapped) < 8:
        raise InvalidRequestError(f"{file} is not a safetensors file: {len(mapped)} bytes")
    (length,) = struct.unpack("<Q", mapped[:8])
    if length > MAX_HEADER_BYTES or 8 + length > len(mapped):
        raise InvalidRequestError(f"{file} is not a safetensors file: a header of {length} bytes")
    try:
        header = json.loads(mapped[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidRequestError(f"{file} is not a safetensors file: its header is not JSON ({error})") from error
    except RecursionError as error:  # the decoder recurses per level: far deeper than any safetensors header
        raise InvalidRequestError(
            validation.HEADER_TOO_DEEP.format(file=file, bound=validation.SAFETENSORS_HEADER_NESTING)
        ) from error
    if not isinstance(header, dict):
        raise InvalidRequestError(f"{file} is not a safetensors file: its header is not a JSON object")
    return header, 8 + length


# ``entry`` is the header's JSON value as read, unchecked: a malformed one raises below and is refused by name
def _tensor(file: Path, mapped: mmap.mmap, start: int, name: str, entry: Any, with_data: bool) -> NamedTensor:
    try:
        dtype, itemsize = SAFETENSORS_DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidRequestError(
            f"tensor {validation.quote(name)} in {file}: unsupported or malformed entry {validation.quote(repr(entry))}"
        ) from error
    fits = begin >= 0 and all(d >= 0 for d in shape) and end - begin == math.prod(shape) * itemsize
    if not fits or start + end > len(mapped):
        raise InvalidRequestError(f"tensor {name!r} in {file}: bytes [{begin}, {end}) do not hold shape {list(shape)}")
    data = mapped[start + begin : start + end] if with_data else b""
    return NamedTensor(name=name, dtype=dtype, shape=shape, data=data)
