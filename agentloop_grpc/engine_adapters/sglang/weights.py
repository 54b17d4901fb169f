"""What the rank-0 actor needs to hand LoadWeights' checkpoints to SGLang's own loader.

SGLang's ``update_weights_from_disk`` takes a model folder (``model_path``, read by its ``DefaultModelLoader``), where
LoadWeights names a safetensors file or a folder of them. ``model_folder`` maps the first onto the second with a
temporary folder holding a link to the file, so SGLang reads the bytes itself and this process reads only headers.
"""

from __future__ import annotations

import contextlib
import mmap
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agentloop_grpc.common.errors import InvalidRequestError

from ..checkpoint import _header, checkpoint_files  # the checkpoint rules every adapter shares (file or folder)


@contextlib.contextmanager
def model_folder(path: str) -> Iterator[tuple[str, int, int]]:
    """The folder SGLang loads for ``path``, with the checkpoint's tensor count and tensor bytes (from the headers).

    InvalidRequestError names what is wrong (no such path, no safetensors file, a file that is not safetensors)
    before SGLang is asked, as every adapter does."""
    files = checkpoint_files(path)
    tensors, size = 0, 0
    for file in files:
        entries = _entries(file)
        tensors += len(entries)
        size += sum(_span(file, name, entry) for name, entry in entries.items())
    if Path(path).is_dir():
        yield path, tensors, size
        return
    # a file: SGLang reads folders only, so it gets one holding just this file (its name must end in .safetensors)
    with tempfile.TemporaryDirectory(prefix="agentloop-load-") as folder:
        (Path(folder) / "model.safetensors").symlink_to(Path(path).resolve())
        yield folder, tensors, size


def _entries(file: Path) -> dict:
    """The header's tensor entries; mapping the file reads no tensor bytes."""
    try:
        with file.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            header, _start = _header(file, mapped)
    except ValueError as error:  # an empty file cannot be mapped
        raise InvalidRequestError(f"{file} is not a safetensors file: {error}") from error
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def _span(file: Path, name: str, entry: object) -> int:
    try:
        begin, end = (int(offset) for offset in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidRequestError(f"tensor {name!r} in {file}: malformed entry {entry!r}") from error
    return end - begin
