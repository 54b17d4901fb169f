"""What the rank-0 actor needs to hand LoadWeights' checkpoints to SGLang's own loader.

SGLang's ``update_weights_from_disk`` takes a model folder (``model_path``, read by its ``DefaultModelLoader``), where
LoadWeights names a safetensors file or a folder of them. ``model_folder`` maps the first onto the second with a
temporary folder holding a link to the file, so SGLang reads the bytes itself and this process reads only headers.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..checkpoint import checkpoint_specs  # the checkpoint rules every adapter shares (file or folder, headers)


@contextlib.contextmanager
def model_folder(path: str) -> Iterator[tuple[str, int, int]]:
    """The folder SGLang loads for ``path``, with the checkpoint's tensor count and tensor bytes (from the headers).

    InvalidRequestError names what is wrong (no such path, no safetensors file, a file that is not safetensors)
    before SGLang is asked, as every adapter does."""
    specs, size = checkpoint_specs(path)
    tensors = len(specs)
    if Path(path).is_dir():
        yield path, tensors, size
        return
    # a file: SGLang reads folders only, so it gets one holding just this file (its name must end in .safetensors)
    with tempfile.TemporaryDirectory(prefix="agentloop-load-") as folder:
        (Path(folder) / "model.safetensors").symlink_to(Path(path).resolve())
        yield folder, tensors, size

