"""Atomic weight updates and the weights' release during Sleep level 2.

``stage`` validates every received tensor against the live parameters (name, dtype, shape) and builds the new
tensors, on the parameters' device, before anything is touched; ``apply`` then swaps them in (pointers, not bytes)
and cannot fail half-way.
Tied parameters are addressable under each of their names (e.g. ``lm_head.weight`` and ``model.embed_tokens.weight``).

``WeightOffload`` frees the parameters' memory for Sleep level 2: the current values (including any update
received since loading) are kept elsewhere and every parameter is replaced by an empty tensor; WakeUp puts them back.
Where depends on where they live: a CPU model's go to a safetensors file in the cache folder (the process's memory
must fall), a GPU model's to host memory (the GPU's must fall; the host of a GPU has plenty).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agentloop_grpc.common.errors import InvalidRequestError
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.common.weight_layout import TensorSpec

TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every name a parameter is known by (tied parameters appear under each name)."""
    return dict(model.named_parameters(remove_duplicate=False))


def _parameter(
    params: dict[str, torch.nn.Parameter], name: str, dtype_name: str, shape: tuple[int, ...]
) -> torch.nn.Parameter:
    """The parameter ``name`` if the tensor fits it; InvalidRequestError naming the tensor otherwise."""
    param = params.get(name)
    if param is None:
        raise InvalidRequestError(f"tensor {name!r} is not a parameter of the model")
    if TORCH_DTYPES.get(dtype_name) != param.dtype:
        raise InvalidRequestError(f"tensor {name!r}: dtype {dtype_name} does not match the parameter's {param.dtype}")
    if tuple(shape) != tuple(param.shape):
        raise InvalidRequestError(
            f"tensor {name!r}: shape {list(shape)} does not match the parameter's {list(param.shape)}"
        )
    return param


def stage(model: torch.nn.Module, tensors: Sequence[NamedTensor]) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Validate and decode all tensors; raise InvalidRequestError naming the first bad one."""
    params = parameters(model)
    staged = []
    for tensor in tensors:
        param = _parameter(params, tensor.name, tensor.dtype, tensor.shape)
        expected = math.prod(tensor.shape) * param.element_size()
        if len(tensor.data) != expected:
            raise InvalidRequestError(f"tensor {tensor.name!r}: {len(tensor.data)} bytes, expected {expected}")
        value = torch.frombuffer(bytearray(tensor.data), dtype=param.dtype).reshape(tensor.shape) if expected else None
        value = value if value is not None else torch.empty(tensor.shape, dtype=param.dtype)
        staged.append((param, value.to(param.device)))
    return staged


def refusal(model: torch.nn.Module, specs: Sequence[TensorSpec]) -> InvalidRequestError | None:
    """Why announced tensors cannot be applied to ``model`` (the first that does not fit); None if they can."""
    params = parameters(model)
    try:
        for spec in specs:
            _parameter(params, spec.name, spec.dtype, spec.shape)
    except InvalidRequestError as error:
        return error
    return None


def stage_views(
    model: torch.nn.Module, views: Sequence[tuple[TensorSpec, torch.Tensor]]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Received tensors (checked by ``refusal``) paired with their parameters."""
    params = parameters(model)
    return [(params[spec.name], value.to(params[spec.name].device)) for spec, value in views]


def apply(staged: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """Point each parameter at its staged value (no copy: the step that waits for the swap waits for no bytes)."""
    for param, value in staged:
        param.data = value


class WeightOffload:
    """Moves a model's parameters off their device and back (Sleep level 2 / WakeUp): a CPU model's to a file, a GPU
    model's to host memory."""

    def __init__(self, model: torch.nn.Module, folder: Path, device: torch.device | None = None) -> None:
        self._model = model
        self._folder = folder
        self._device = device or torch.device("cpu")
        self._file: Path | None = None
        self._host: dict[str, torch.Tensor] | None = None

    @property
    def offloaded(self) -> bool:
        return self._file is not None or self._host is not None

    def offload(self) -> None:
        if self.offloaded:
            return
        unique = dict(self._model.named_parameters())
        if self._device.type == "cpu":
            self._file = self._to_file(unique)
        else:
            self._host = {name: param.detach().to("cpu", copy=True) for name, param in unique.items()}
        for param in unique.values():
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    def _to_file(self, unique: dict[str, torch.nn.Parameter]) -> Path:
        self._folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="weights-", suffix=".safetensors", dir=self._folder)
        os.close(handle)
        save_file({k: v.detach().contiguous() for k, v in unique.items()}, name)
        return Path(name)

    def restore(self) -> None:
        if not self.offloaded:
            return
        kept = self._host if self._host is not None else load_file(str(self._file))
        for name, param in self._model.named_parameters():
            param.data = kept[name].to(self._device)
        if self._file is not None:
            self._file.unlink()
        self._file, self._host = None, None
